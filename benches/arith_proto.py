# Prototype (PyTorch + transformers) of the embedded default's self-distillation dynamics, used
# to choose the arithmetic level table before the Rust stages exist. It mirrors src/arith (same
# templates, the count capped at twice the operands' range) with the solution restating each
# change before its arithmetic line, trains a 0.86M-parameter Qwen3 from scratch on levels
# 1..EASY, samples level EASY+1 at temperature 0.7, keeps the correct samples, retrains on the
# union, and prints pass@1 per level before and after. Not run by CI.
#
#   python benches/arith_proto.py "[(1,1),(2,1),(3,1),(4,1),(5,1),(6,1)]" 3 3000 600
#   (levels as (steps, digits), pretrain levels 1..3, 3000 problems per level, 600 steps)
#
# Findings (2026-11-22, 2 threads): see the issue 5 notes.
# Prototype of the tiny-arith self-distillation dynamics (PyTorch), mirroring src/arith.
import re, sys, time, math, random, json
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
torch.manual_seed(0)
NAMES="Ana Ben Carla Dev Emma Finn Gia Hugo Ines Jon Kim Leo".split()
THINGS="apples stamps marbles coins books shells cards pencils stickers beads".split()
GAIN=["buys","finds","gets"]; LOSS=["gives away","loses","sells"]
def number(r,d):
    lo=1 if d<=1 else 10**(d-1); return r.randrange(lo,10**d)
def make(r,steps,digits):
    name=r.choice(NAMES); th=r.choice(THINGS); c=number(r,digits)
    p=f"{name} has {c} {th}."; s=p+"\n"
    for _ in range(steps):
        d=number(r,digits); cap=2*10**digits-1
        sub = (c+d>cap or r.random()<0.5) and d<=c
        if not sub and c+d>cap:
            d=r.randrange(1,c+1); sub=True
        n=c-d if sub else c+d
        if sub: t=f"{name} {r.choice(LOSS)} {d}."; p+=" "+t; s+=f"{t} {c} - {d} = {n}.\n"
        else: t=f"{name} {r.choice(GAIN)} {d} more."; p+=" "+t; s+=f"{t} {c} + {d} = {n}.\n"
        c=n
    p+=f" How many {th} does {name} have now?"; s+=f"\\boxed{{{c}}}"
    return p,s,str(c)
PAT=re.compile(r"\d| ?[A-Za-z]+| ?[^\sA-Za-z\d]|\n| ")
def pieces(t): return PAT.findall(t)
LEVELS=eval(sys.argv[1]) if len(sys.argv)>1 else [(1,1),(1,2),(2,2),(3,2),(4,2),(5,2)]
EASY=int(sys.argv[2]) if len(sys.argv)>2 else 3
NPRE=int(sys.argv[3]) if len(sys.argv)>3 else 4000
STEPS=int(sys.argv[4]) if len(sys.argv)>4 else 600
r=random.Random(1)
seen=set()
def gen(levels,n):
    out=[]
    for lv in levels:
        k=0
        while k<n:
            p,s,a=make(r,*LEVELS[lv-1])
            if p in seen: continue
            seen.add(p); out.append((lv,p,s,a)); k+=1
    return out
pre=gen(range(1,EASY+1),NPRE)
hard=EASY+1
samp=gen([hard],400)
ev=gen(range(1,len(LEVELS)+1),100)
vocab={"<eos>":0}
for _,p,s,_ in pre+samp+ev:
    for x in pieces(p+"\n")+pieces(s):
        vocab.setdefault(x,len(vocab))
inv={i:t for t,i in vocab.items()}
enc=lambda t:[vocab[x] for x in pieces(t)]
print("vocab",len(vocab))
cfg=Qwen3Config(vocab_size=len(vocab),hidden_size=128,intermediate_size=384,num_hidden_layers=4,num_attention_heads=4,num_key_value_heads=4,head_dim=32,max_position_embeddings=512,tie_word_embeddings=True,rope_theta=10000.0)
torch.set_num_threads(1)
model=Qwen3ForCausalLM(cfg)
print("params",sum(p.numel() for p in model.parameters()))
def rows(data): return [(enc(p+"\n"),enc(s)+[0]) for _,p,s,_ in data]
def train(model,rws,steps,lr,bs=32):
    opt=torch.optim.AdamW(model.parameters(),lr=lr,betas=(0.9,0.95),weight_decay=0.0)
    t0=time.time(); ntok=0
    for st in range(steps):
        b=random.sample(rws,bs)
        L=max(len(p)+len(c) for p,c in b)
        ids=torch.zeros(bs,L,dtype=torch.long); lab=torch.full((bs,L),-100)
        for i,(p,c) in enumerate(b):
            x=p+c; ids[i,:len(x)]=torch.tensor(x); lab[i,len(p):len(x)]=torch.tensor(c); ntok+=len(x)
        w=min(1,(st+1)/50)*0.5*(1+math.cos(math.pi*st/steps))
        for g in opt.param_groups: g["lr"]=lr*w
        out=model(input_ids=ids,labels=lab)
        opt.zero_grad(); out.loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step()
        if st%100==0: print(st,round(out.loss.item(),4),f"{ntok/(time.time()-t0):.0f} tok/s",flush=True)
@torch.no_grad()
def sample(model,data,n,temp):
    res=[]
    model.eval()
    for i in range(0,len(data),64):
        chunk=data[i:i+64]
        for _ in range(n):
            outs=[]
            for lv,p,s,a in chunk:
                outs.append(enc(p+"\n"))
            L=max(map(len,outs))
            ids=torch.zeros(len(outs),L,dtype=torch.long); att=torch.zeros(len(outs),L,dtype=torch.long)
            for j,o in enumerate(outs): ids[j,L-len(o):]=torch.tensor(o); att[j,L-len(o):]=1
            g=model.generate(input_ids=ids,attention_mask=att,max_new_tokens=160,do_sample=temp>0,temperature=temp if temp>0 else None,top_k=0,top_p=1.0,eos_token_id=0,pad_token_id=0)
            for j,(lv,p,s,a) in enumerate(chunk):
                toks=[t for t in g[j,L:].tolist()]
                if 0 in toks: toks=toks[:toks.index(0)]
                txt="".join(inv[t] for t in toks)
                m=re.search(r"\\boxed\{(\d+)\}",txt)
                res.append((lv,p,txt,m is not None and m.group(1)==a))
    model.train()
    return res
def acc(res):
    by={}
    for lv,_,_,ok in res: by.setdefault(lv,[]).append(ok)
    return {lv:round(sum(v)/len(v),3) for lv,v in sorted(by.items())}
t0=time.time()
import os
CK=f"/tmp/proto/ck_{abs(hash((str(LEVELS),EASY,NPRE,STEPS,open(__file__).read()[:2000])))}.pt"
if os.path.exists(CK): model.load_state_dict(torch.load(CK))
else:
    train(model,rows(pre),STEPS,1e-3); torch.save(model.state_dict(),CK)
print("pretrain",time.time()-t0)
for lv,p,t,ok in sample(model,[e for e in ev if e[0]==EASY+1][:6],1,0.7): print("----",ok,p,"\n",t)
print("base eval T=0.7",acc(sample(model,ev,1,0.7)))
sm=sample(model,samp,4,0.7)
good=[(0,p,t,"") for lv,p,t,ok in sm if ok]
print("sampled correct",len(good),"of",len(sm))
mix=rows(pre)+[(enc(p+"\n"),enc(t)+[0]) for _,p,t,_ in good]
train(model,mix,STEPS//2,3e-4)
print("trained eval T=0.7",acc(sample(model,ev,1,0.7)))
print("total",time.time()-t0)
