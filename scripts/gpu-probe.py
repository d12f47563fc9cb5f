#!/usr/bin/env python3
"""PyTorch peer figures on the GPU our Rust/CUDA code runs on (issues 50 and 51).

What it measures, each in plain PyTorch eager (and CUDA graphs where said), bf16, random weights,
no torch.compile anywhere:

  ceilings  device-to-device copy bandwidth (read+write bytes) and the bf16 matmul rate at 8192^3;
            the GPU's name, SM count, L2 size, torch/CUDA versions
  gemm      cuBLAS (F.linear, weight [N, K]) at Qwen3-4B's decode shapes for M = 1..256 rows, and
            the "GEMM floor" of one decode step (36 layers + lm_head) per M
  decode    a whole Qwen3-4B-shaped decode step (B sequences at context 2176, 1 new token each),
            eager and as one CUDA graph, against the bytes it must read; SDPA decode attention of
            one layer alone (the peer of our paged decode attention kernel)
  gdn       one Qwen3.5-4B Gated DeltaNet layer's decode step (the recurrent delta rule as torch
            ops), eager and as a CUDA graph; CUDA kernels per layer in eager mode
  train     transformers' Qwen3ForCausalLM (Qwen3-4B config) full fine-tune step on one 4,096-token
            row: forward+backward with gradient checkpointing (and without, if it fits), fused AdamW
            on bf16 params; SDPA causal attention forward/backward per backend

These are the figures our sampler and trainer are compared against: PyTorch on the same GPU.
Every section is wrapped so a failure prints its error and the next section still runs; the
numbers go to DIR/probe.json (written again after each section) and a short table is printed at
the end. On an H100 the whole run takes about 60-100 s (estimates at the top of each section).

  python3 scripts/gpu-probe.py --out $OUT                 # on the GPU machine
  python3 scripts/gpu-probe.py --small --out /tmp/probe   # tiny shapes; runs on a CPU in seconds
  python3 scripts/gpu-probe.py --sections ceilings,decode # a subset
"""

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings

import torch
import torch.nn.functional as F

START = time.perf_counter()
warnings.filterwarnings("ignore", category=FutureWarning)  # transformers' renames, once per call
SECTIONS = ["ceilings", "gemm", "decode", "gdn", "train"]


# ---------------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------------

FULL = dict(
    hidden=2560, heads=32, kv_heads=8, head_dim=128, inter=9728, vocab=151936, layers=36,
    ctx=2176, batches=[1, 32, 128, 256], gemm_rows=[1, 8, 32, 64, 128, 256],
    copy_bytes=2 << 30, mm=8192,
    gdn=dict(k_heads=16, v_heads=32, k_dim=128, v_dim=128, conv=4),
    train_seq=4096,
)
SMALL = dict(
    hidden=64, heads=4, kv_heads=2, head_dim=16, inter=128, vocab=1000, layers=2,
    ctx=64, batches=[1, 4], gemm_rows=[1, 8],
    copy_bytes=16 << 20, mm=256,
    gdn=dict(k_heads=2, v_heads=4, k_dim=16, v_dim=16, conv=4),
    train_seq=64,
)


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------

class Probe:
    """What the sections share: device, dtype, shapes, repeat counts, the results dict."""

    def __init__(self, args):
        self.small = args.small
        self.cuda = torch.cuda.is_available()
        self.dev = torch.device("cuda" if self.cuda else "cpu")
        self.dt = torch.bfloat16
        self.shape = SMALL if args.small else FULL
        self.budget = args.budget
        self.out = args.out
        self.results = {"meta": {}, "errors": {}}
        self.copy_bw = None      # bytes/s, from `ceilings` (or a quick copy when it was skipped)
        self.mm_flops = None     # FLOP/s, from `ceilings`
        # repeats: (iterations, warm-ups); tiny on the CPU
        self.reps = (lambda it, wu: (it, wu)) if not args.small else (lambda it, wu: (min(it, 3), 1))

    def left(self):
        return self.budget - (time.perf_counter() - START)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def free(self):
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "probe.json")
        with open(path, "w") as f:
            json.dump(self.results, f, indent=1, default=str)
        return path


def say(section, msg):
    print(f"[{section}] {msg}", flush=True)


def median_time(P, fn, iters, warmup, inner=1):
    """Median seconds per call of fn. fn is called `inner` times per timed sample.

    CUDA: a pair of events around each sample, all samples queued without a host sync in between
    (so a launch-bound fn is timed at its launch rate), one synchronize at the end. CPU:
    time.perf_counter around each sample.
    """
    for _ in range(warmup):
        fn()
    P.sync()
    times = []
    if P.cuda:
        pairs = []
        for _ in range(iters):
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(inner):
                fn()
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 / inner for s, e in pairs]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def capture_graph(fn, warmup=3):
    """fn captured into a torch.cuda.CUDAGraph, warmed up on a side stream as PyTorch's docs say.

    fn must not sync with the host; the tensors it reads and writes must stay alive (they are its
    static inputs and outputs).
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def graph_or_eager_time(P, fn, calls, iters, warmup):
    """Median seconds per op, where fn issues `calls` ops: as one CUDA graph replay on a GPU (so
    launch overhead does not hide short kernels), fn itself on a CPU. Returns (seconds, how)."""
    if P.cuda:
        g = capture_graph(fn)
        t = median_time(P, g.replay, iters, warmup) / calls
        del g
        return t, "graph"
    return median_time(P, fn, iters, warmup) / calls, "eager"


def randn(P, *shape, std=1.0, dtype=None):
    return torch.empty(*shape, device=P.dev, dtype=dtype or P.dt).normal_(0.0, std)


def rms_norm(x, w, eps=1e-6):
    """x * rsqrt(mean(x^2) + eps) * w in f32, cast back to x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def quick_copy_bw(P):
    n = (256 << 20) if not P.small else (4 << 20)
    a = torch.empty(n // 2, device=P.dev, dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    t = median_time(P, lambda: b.copy_(a), *P.reps(10, 3))
    del a, b
    return 2 * n / t


def need_copy_bw(P, section):
    if P.copy_bw is None:
        P.copy_bw = quick_copy_bw(P)
        say(section, f"(ceilings not run: a quick {256 if not P.small else 4} MiB copy gives "
                     f"{P.copy_bw / 1e9:.0f} GB/s)")
    return P.copy_bw


def f1(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


# ---------------------------------------------------------------------------------------------
# 1. ceilings  (H100: ~3 s: 4 GiB of allocation, 23 copies of 2 GiB, 13 matmuls of 1.1 TFLOP)
# ---------------------------------------------------------------------------------------------

def sec_ceilings(P):
    name = "ceilings"
    r = P.results.setdefault(name, {})
    meta = P.results["meta"]
    meta.update(torch=torch.__version__, cuda=torch.version.cuda, device=str(P.dev),
                small=P.small, python=sys.version.split()[0])
    if P.cuda:
        pr = torch.cuda.get_device_properties(0)
        meta.update(gpu=pr.name, sms=pr.multi_processor_count,
                    l2_bytes=getattr(pr, "L2_cache_size", None), mem_bytes=pr.total_memory,
                    capability=f"{pr.major}.{pr.minor}", cudnn=torch.backends.cudnn.version())
        say(name, f"GPU {pr.name} (sm_{pr.major}{pr.minor}), {pr.multi_processor_count} SMs, "
                  f"L2 {meta['l2_bytes'] / 2**20 if meta['l2_bytes'] else 0:.0f} MiB, "
                  f"{pr.total_memory / 2**30:.1f} GiB; torch {torch.__version__}, "
                  f"CUDA {torch.version.cuda}, cuDNN {meta['cudnn']}")
    else:
        say(name, f"no GPU: CPU, torch {torch.__version__}")

    nbytes = P.shape["copy_bytes"]
    a = torch.empty(nbytes // 2, device=P.dev, dtype=torch.bfloat16).normal_()
    b = torch.empty_like(a)
    t = median_time(P, lambda: b.copy_(a), *P.reps(20, 3))
    P.copy_bw = 2 * nbytes / t
    r.update(copy_bytes=nbytes, copy_s=t, copy_bw=P.copy_bw)
    say(name, f"copy {nbytes / 2**30:.3g} GiB bf16: {t * 1e3:.3f} ms, {P.copy_bw / 1e9:.0f} GB/s "
              f"(read+write)")
    del a, b
    P.free()

    n = P.shape["mm"]
    x = randn(P, n, n)
    y = randn(P, n, n)
    t = median_time(P, lambda: torch.matmul(x, y), *P.reps(10, 3))
    P.mm_flops = 2 * n ** 3 / t
    r.update(mm_n=n, mm_s=t, mm_flops=P.mm_flops)
    say(name, f"bf16 matmul {n}^3: {t * 1e3:.3f} ms, {P.mm_flops / 1e12:.0f} TFLOP/s")
    del x, y


# ---------------------------------------------------------------------------------------------
# 2. gemm  (H100: ~5 s: 48 (shape, M) points, each one small CUDA graph of 20 F.linear calls)
# ---------------------------------------------------------------------------------------------

def qwen3_gemm_shapes(s):
    """(name, N, K) of Qwen3-4B's decode GEMMs: weight [N, K] as nn.Linear stores it."""
    h, hd = s["hidden"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    return [
        ("q_proj", q, h), ("k_proj", kv, h), ("v_proj", kv, h), ("qkv", q + 2 * kv, h),
        ("o_proj", h, q), ("gate_up", 2 * s["inter"], h), ("down", h, s["inter"]),
        ("lm_head", s["vocab"], h),
    ]


def sec_gemm(P):
    name = "gemm"
    s = P.shape
    bw = need_copy_bw(P, name)
    rows = []
    P.results[name] = {"rows": rows}
    times = {}  # (shape, M) -> seconds
    for sname, n, k in qwen3_gemm_shapes(s):
        wbytes = n * k * 2
        copies = 4 if wbytes < 200e6 else 1  # 4 rotating copies keep a weight out of L2 (50 MB)
        ws = [randn(P, n, k, std=0.02) for _ in range(copies)]
        for m in s["gemm_rows"]:
            x = randn(P, m, k)
            calls = 20 if P.cuda else 4
            seq = [ws[i % copies] for i in range(calls)]

            def body(x=x, seq=seq):
                for w in seq:
                    F.linear(x, w)

            t, how = graph_or_eager_time(P, body, calls, *P.reps(10, 2))
            moved = wbytes + (m * k + m * n) * 2
            row = dict(shape=sname, n=n, k=k, m=m, us=t * 1e6, gbs=moved / t / 1e9,
                       tflops=2 * m * n * k / t / 1e12, pct_copy=100 * moved / t / bw,
                       copies=copies, timed_as=how)
            rows.append(row)
            times[(sname, m)] = t
            say(name, f"{sname:8s} N={n:6d} K={k:5d} M={m:3d}: {row['us']:8.1f} us "
                      f"{row['gbs']:7.0f} GB/s ({row['pct_copy']:5.1f}% of copy) "
                      f"{row['tflops']:6.1f} TFLOP/s")
            del x
        del ws
        P.free()

    floor = {}
    for m in s["gemm_rows"]:
        layer = sum(times[(nm, m)] for nm in ("qkv", "o_proj", "gate_up", "down"))
        step = layer * s["layers"] + times[("lm_head", m)]
        floor[m] = dict(step_ms=step * 1e3, tok_s=m / step)
        say(name, f"GEMM floor of a decode step, M={m:3d}: {step * 1e3:7.3f} ms "
                  f"({s['layers']} x (qkv+o+gate_up+down) + lm_head) = {m / step:9.0f} tok/s")
    P.results[name]["floor"] = floor


# ---------------------------------------------------------------------------------------------
# 3. decode  (H100: ~15 s: 9 GB of weights; per B a KV cache of up to 41 GB, 13 eager steps,
#             one capture, 23 replays; the attention alone under 4 backends)
# ---------------------------------------------------------------------------------------------

def rope_cos_sin(P, pos, head_dim, theta=1e6):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=P.dev, dtype=torch.float32) / head_dim))
    f = pos * inv
    emb = torch.cat([f, f])
    return emb.cos().to(P.dt), emb.sin().to(P.dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def sdpa_backends():
    """(label, SDPBackend or None for the default choice) of the backends to try."""
    from torch.nn.attention import SDPBackend
    out = [("default", None)]
    for label in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):  # cuDNN last
        be = getattr(SDPBackend, label, None)
        if be is not None:
            out.append((label.split("_")[0].lower(), be))
    return out


def with_backend(be, fn):
    """fn run under torch.nn.attention.sdpa_kernel(be) (be None: the default choice)."""
    if be is None:
        return fn
    from torch.nn.attention import sdpa_kernel

    def wrapped():
        with sdpa_kernel(be):
            return fn()
    return wrapped


def sec_decode(P):
    name = "decode"
    s = P.shape
    bw = need_copy_bw(P, name)
    H, NQ, NKV, HD, I, V, L = (s[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "inter",
                                               "vocab", "layers"))
    dt = P.dt
    res = P.results[name] = {"batches": {}}

    # Weights: every layer its own (bytes read per step as the real model), untied lm_head.
    layers = []
    for _ in range(L):
        layers.append(dict(
            ln1=torch.ones(H, device=P.dev, dtype=dt), ln2=torch.ones(H, device=P.dev, dtype=dt),
            qn=torch.ones(HD, device=P.dev, dtype=dt), kn=torch.ones(HD, device=P.dev, dtype=dt),
            wqkv=randn(P, (NQ + 2 * NKV) * HD, H, std=0.02), wo=randn(P, H, NQ * HD, std=0.02),
            wgu=randn(P, 2 * I, H, std=0.02), wd=randn(P, H, I, std=0.02)))
    emb = randn(P, V, H, std=0.02)
    final_norm = torch.ones(H, device=P.dev, dtype=dt)
    lm_head = randn(P, V, H, std=0.02)
    n_params = sum(t.numel() for lw in layers for t in lw.values()) + final_norm.numel() + lm_head.numel()
    weight_bytes = n_params * 2
    res.update(params_read=n_params, weight_bytes=weight_bytes)
    say(name, f"weights read per step: {n_params / 1e9:.3f} B params = {weight_bytes / 1e9:.2f} GB "
              f"(layers + final norm + lm_head; the embedding reads B rows only)")

    for B in s["batches"]:
        if P.left() < 55:  # leave gdn and train their ~45 s
            say(name, f"B={B}: skipped, {P.left():.0f} s of the budget left")
            break
        try:
            r = res["batches"][B] = {}
            ctx = s["ctx"]
            per_layer = B * NKV * ctx * HD * 2 * 2  # K and V, bf16
            n_kv = L
            if P.cuda:
                avail = torch.cuda.mem_get_info()[0] - (6 << 30)
                if per_layer * L > avail:
                    n_kv = 4  # reused cyclically: layer i reads cache i % 4
                    if per_layer * n_kv > avail:
                        ctx = max(64, int(ctx * avail / (per_layer * n_kv)) // 64 * 64)
                        per_layer = B * NKV * ctx * HD * 2 * 2
            kc = [randn(P, B, NKV, ctx, HD) for _ in range(n_kv)]
            vc = [randn(P, B, NKV, ctx, HD) for _ in range(n_kv)]
            kv_bytes = per_layer * L
            note = ("" if n_kv == L else
                    f"; KV cache for {n_kv} distinct layers reused cyclically over {L} (same bytes "
                    f"read per step; each layer's KV is far bigger than L2)")
            if ctx != s["ctx"]:
                note += f"; ctx scaled down from {s['ctx']} to {ctx} to fit"
            r.update(ctx=ctx, kv_layers=n_kv, kv_bytes=kv_bytes, note=note.lstrip("; "))
            say(name, f"B={B}: ctx {ctx}, KV read per step {kv_bytes / 1e9:.2f} GB{note}")

            pos = ctx - 1  # the new token's K/V go into the last slot; attention covers ctx keys
            cos, sin = rope_cos_sin(P, pos, HD)
            ids = torch.randint(0, V, (B,), device=P.dev)

            def layer(x, lw, kcache, vcache):
                h = rms_norm(x, lw["ln1"])
                q, k, v = F.linear(h, lw["wqkv"]).split([NQ * HD, NKV * HD, NKV * HD], -1)
                q = rms_norm(q.view(B, NQ, HD), lw["qn"])
                k = rms_norm(k.view(B, NKV, HD), lw["kn"])
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                kcache[:, :, pos] = k
                vcache[:, :, pos] = v.view(B, NKV, HD)
                a = F.scaled_dot_product_attention(q.unsqueeze(2), kcache, vcache, enable_gqa=True)
                x = x + F.linear(a.reshape(B, NQ * HD), lw["wo"])
                g, u = F.linear(rms_norm(x, lw["ln2"]), lw["wgu"]).chunk(2, -1)
                return x + F.linear(F.silu(g) * u, lw["wd"])

            def step():
                x = F.embedding(ids, emb)
                for i, lw in enumerate(layers):
                    x = layer(x, lw, kc[i % n_kv], vc[i % n_kv])
                logits = F.linear(rms_norm(x, final_norm), lm_head)
                ids.copy_(logits.argmax(-1))  # the next token stays on the GPU: no host sync

            need = weight_bytes + kv_bytes + B * H * 2
            floor = need / bw
            t_e = median_time(P, step, *P.reps(10, 3))
            r.update(bytes=need, floor_ms=floor * 1e3, eager_ms=t_e * 1e3, eager_tok_s=B / t_e,
                     eager_roofline_pct=100 * floor / t_e)
            say(name, f"B={B}: eager {t_e * 1e3:8.2f} ms/step {B / t_e:8.0f} tok/s, "
                      f"{100 * floor / t_e:5.1f}% of roofline (floor {floor * 1e3:.2f} ms "
                      f"= {need / 1e9:.2f} GB at copy bandwidth)")
            if P.cuda:
                g = capture_graph(step)
                t_g = median_time(P, g.replay, *P.reps(20, 3))
                del g
                r.update(graph_ms=t_g * 1e3, graph_tok_s=B / t_g, graph_roofline_pct=100 * floor / t_g)
                say(name, f"B={B}: graph {t_g * 1e3:8.2f} ms/step {B / t_g:8.0f} tok/s, "
                          f"{100 * floor / t_g:5.1f}% of roofline")
            P.free()

            # The attention of one layer alone: SDPA over the cache, rotating over up to 8 layers'
            # caches so that a small B's KV (8.9 MB a layer at B=1) is not served from L2.
            q = randn(P, B, NQ, 1, HD)
            caches = list(zip(kc, vc))[:8]
            r["attention"] = {}
            for label, be in sdpa_backends():
                def body(caches=caches, q=q):
                    for kk, vv in caches:
                        F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True)
                try:
                    t, how = graph_or_eager_time(P, with_backend(be, body), len(caches), *P.reps(10, 2))
                    gbs = per_layer / t
                    r["attention"][label] = dict(ms=t * 1e3, gbs=gbs / 1e9, pct_copy=100 * gbs / bw,
                                                 timed_as=how)
                    say(name, f"B={B}: SDPA decode attention, one layer, {label:9s}: {t * 1e3:7.3f} ms "
                              f"{gbs / 1e9:6.0f} GB/s of KV = {100 * gbs / bw:5.1f}% of copy")
                except Exception as e:  # a backend that refuses this shape
                    r["attention"][label] = dict(error=str(e).splitlines()[0][:200])
                    say(name, f"B={B}: SDPA {label}: not available ({str(e).splitlines()[0][:120]})")
                P.free()
            del kc, vc, q, caches
        except Exception as e:
            res["batches"].setdefault(B, {})["error"] = repr(e)[:500]
            say(name, f"B={B}: FAILED {e!r}"[:400])
            traceback.print_exc()
        finally:
            kc = vc = g = None
            P.free()


# ---------------------------------------------------------------------------------------------
# 4. gdn  (H100: ~3 s: 4 batch sizes x (13 eager + capture + 23 replays) of one layer, a short
#          profile; the first profiler start (CUPTI) may take a second or two)
# ---------------------------------------------------------------------------------------------

def sec_gdn(P):
    name = "gdn"
    s = P.shape
    g_ = s["gdn"]
    bw = need_copy_bw(P, name)
    H = s["hidden"]
    NK, NV, DK, DV, KC = g_["k_heads"], g_["v_heads"], g_["k_dim"], g_["v_dim"], g_["conv"]
    CONV = 2 * NK * DK + NV * DV       # q, k, v channels through the conv: 8192
    QKVZ = CONV + NV * DV              # + z: 12288
    REP = NV // NK
    dt = P.dt
    res = P.results[name] = {"batches": {}}

    w_qkvz = randn(P, QKVZ, H, std=0.02)
    w_ba = randn(P, 2 * NV, H, std=0.02)
    conv_w = randn(P, CONV, KC, std=0.5)
    a_log = torch.log(torch.empty(NV, device=P.dev).uniform_(1, 16))  # f32, as the model keeps it
    dt_bias = torch.ones(NV, device=P.dev)
    norm_w = torch.ones(DV, device=P.dev, dtype=dt)
    w_out = randn(P, H, NV * DV, std=0.02)
    weight_bytes = sum(t.numel() * t.element_size()
                       for t in (w_qkvz, w_ba, conv_w, a_log, dt_bias, norm_w, w_out))
    res["weight_bytes"] = weight_bytes

    def make(B):
        x = randn(P, B, H)
        conv_state = randn(P, B, CONV, KC)
        state = randn(P, B, NV, DK, DV, std=0.01, dtype=torch.float32)
        out = torch.empty(B, H, device=P.dev, dtype=dt)

        def l2norm(t):
            return t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6)

        def step():
            mixed, z = F.linear(x, w_qkvz).split([CONV, NV * DV], -1)
            b, a = F.linear(x, w_ba).split([NV, NV], -1)
            # causal depthwise conv1d update: shift the new column in, weight, sum, SiLU
            conv_state.copy_(torch.cat([conv_state[:, :, 1:], mixed.unsqueeze(-1)], -1))
            mixed = F.silu((conv_state * conv_w).sum(-1))
            q, k, v = mixed.split([NK * DK, NK * DK, NV * DV], -1)
            q = l2norm(q.float().view(B, NK, DK)) * DK ** -0.5
            k = l2norm(k.float().view(B, NK, DK))
            v = v.float().view(B, NV, DV)
            # each key head serves REP consecutive value heads (repeat_interleave, without a sync)
            q = q.unsqueeze(2).expand(B, NK, REP, DK).reshape(B, NV, DK)
            k = k.unsqueeze(2).expand(B, NK, REP, DK).reshape(B, NV, DK)
            beta = torch.sigmoid(b.float())
            g = -a_log.exp() * F.softplus(a.float() + dt_bias)
            # recurrent delta rule on S [B, NV, DK, DV] f32, in place
            state.mul_(g.exp()[..., None, None])
            kv_mem = (state * k.unsqueeze(-1)).sum(-2)
            delta = (v - kv_mem) * beta.unsqueeze(-1)
            state.add_(k.unsqueeze(-1) * delta.unsqueeze(-2))
            o = (state * q.unsqueeze(-1)).sum(-2)
            # gated RMSNorm, out_proj
            o = rms_norm(o, norm_w) * F.silu(z.float().view(B, NV, DV))
            out.copy_(F.linear(o.to(dt).reshape(B, NV * DV), w_out))

        return step, (x, conv_state, state, out)

    for B in s["batches"]:
        try:
            r = res["batches"][B] = {}
            step, keep = make(B)
            moved = (weight_bytes + B * NV * DK * DV * 4 * 2 + B * CONV * KC * 2 * 2
                     + B * H * 2 * 2)
            floor = moved / bw
            t_e = median_time(P, step, *P.reps(10, 3))
            r.update(bytes=moved, floor_ms=floor * 1e3, eager_ms=t_e * 1e3,
                     eager_pct_copy=100 * floor / t_e)
            line = (f"B={B:3d}: eager {t_e * 1e3:7.3f} ms/layer ({100 * floor / t_e:5.1f}% of copy "
                    f"for {moved / 1e6:.1f} MB: weights {weight_bytes / 1e6:.1f} MB + state r+w)")
            if P.cuda:
                g = capture_graph(step)
                t_g = median_time(P, g.replay, *P.reps(20, 3))
                del g
                r.update(graph_ms=t_g * 1e3, graph_pct_copy=100 * floor / t_g)
                line += f", graph {t_g * 1e3:7.3f} ms/layer ({100 * floor / t_g:5.1f}%)"
            say(name, line)
            del step, keep
        except Exception as e:
            res["batches"].setdefault(B, {})["error"] = repr(e)[:500]
            say(name, f"B={B}: FAILED {e!r}"[:400])
            traceback.print_exc()
        P.free()

    # kernels per layer in eager mode, one short profile at B=32 (B=4 in --small)
    from torch.profiler import ProfilerActivity, profile
    B = 32 if 32 in s["batches"] else s["batches"][-1]
    step, keep = make(B)
    step()
    P.sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if P.cuda else [])
    with profile(activities=acts) as prof:
        step()
        P.sync()
    evs = prof.events()
    if P.cuda:
        dev_evs = [e for e in evs if str(e.device_type).endswith("CUDA")]
        kernels = [e for e in dev_evs if not e.name.lower().startswith(("memcpy", "memset"))]
        if not dev_evs:  # a profiler that only hangs kernels under their CPU ops
            kernels = dev_evs = [k for e in evs for k in getattr(e, "kernels", [])]
        res.update(profile_b=B, cuda_events=len(dev_evs), kernels_per_layer=len(kernels))
        say(name, f"B={B}: {len(kernels)} CUDA kernels per layer in eager mode "
                  f"({len(dev_evs)} CUDA events incl. memcpy/memset)")
    else:
        ops = [e for e in evs if e.cpu_parent is None and e.name.startswith("aten::")]
        res.update(profile_b=B, top_level_aten_ops=len(ops))
        say(name, f"B={B}: no CUDA; {len(ops)} top-level aten ops per layer (CPU profile)")
    del step, keep, prof


# ---------------------------------------------------------------------------------------------
# 5. train  (H100: ~35 s: import transformers ~5 s, build 4B params on the GPU ~5 s, 4 steps with
#            checkpointing ~2 s, 4 without ~2 s, AdamW 8 x ~25 ms, SDPA 3 backends ~1 s)
# ---------------------------------------------------------------------------------------------

def train_step_times(P, model, opt, ids, iters=3, warmup=1):
    """Median forward+backward and optimizer-step seconds (each timed alone), peak bytes, loss."""
    if P.cuda:
        torch.cuda.reset_peak_memory_stats()
    fb, st = [], []
    loss = None
    for i in range(warmup + iters):
        if P.cuda:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            ev[0].record()
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        if P.cuda:
            ev[1].record()
        t1 = time.perf_counter()
        opt.step()
        if P.cuda:
            ev[2].record()
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if i >= warmup:
            if P.cuda:
                torch.cuda.synchronize()
                fb.append(ev[0].elapsed_time(ev[1]) / 1e3)
                st.append(ev[1].elapsed_time(ev[2]) / 1e3)
            else:
                fb.append(t1 - t0)
                st.append(t2 - t1)
    P.sync()
    peak = torch.cuda.max_memory_allocated() if P.cuda else None
    return statistics.median(fb), statistics.median(st), peak, float(loss.detach().float())


def sec_train(P):
    name = "train"
    s = P.shape
    res = P.results[name] = {}
    import transformers
    from transformers import Qwen3Config, Qwen3ForCausalLM
    res["transformers"] = transformers.__version__
    dt = P.dt if P.cuda else torch.float32
    if P.small:
        cfg = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    else:
        cfg = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                   num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    cfg.update(max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
               tie_word_embeddings=True, attn_implementation="sdpa")
    config = Qwen3Config(**cfg)
    try:
        config._attn_implementation = "sdpa"
        setattr(config, "dtype" if hasattr(config, "dtype") else "torch_dtype", dt)
    except Exception as e:
        say(name, f"config: {e!r}")
    rope = getattr(config, "rope_parameters", None) or {}
    say(name, f"transformers {transformers.__version__}; rope_theta seen by the config: "
              f"{rope.get('rope_theta', getattr(config, 'rope_theta', '?'))}; dtype {dt}")

    t0 = time.perf_counter()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dt)
    try:
        with torch.device(P.dev):  # built on the GPU: no 16 GB of f32 on the host
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())  # tied embedding counted once
    res.update(params=n_params, build_s=time.perf_counter() - t0)
    say(name, f"Qwen3ForCausalLM built in {res['build_s']:.1f} s: {n_params / 1e9:.3f} B params "
              f"({next(model.parameters()).dtype}, tied embedding counted once)")

    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        fused = True
    except Exception as e:
        say(name, f"fused AdamW refused ({e}); the plain one")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
        fused = False
    res["optimizer"] = (f"torch.optim.AdamW(fused={fused}) on the {dt} params: pure {dt}, no f32 "
                        f"master (our trainer keeps an f32 master, so its optimizer moves more bytes)")
    say(name, res["optimizer"])
    seq = s["train_seq"]
    ids = torch.randint(0, config.vocab_size, (1, seq), device=P.dev)
    peak_flops = 989e12

    variants = [("recompute", True), ("no_recompute", False)]
    for label, ckpt in variants:
        if not ckpt and P.left() < 15:
            say(name, f"{label}: skipped, {P.left():.0f} s of the budget left")
            continue
        try:
            if ckpt:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_disable()
            t_fb, t_opt, peak, loss = train_step_times(P, model, opt, ids)
            t = t_fb + t_opt
            flops = 6 * n_params * seq
            r = res[label] = dict(fwd_bwd_ms=t_fb * 1e3, opt_ms=t_opt * 1e3, tok_s=seq / t,
                                  mfu_pct=100 * flops / t / peak_flops, peak_bytes=peak, loss=loss)
            extra = ""
            if P.mm_flops:
                r["pct_of_measured_matmul"] = 100 * flops / t / P.mm_flops
                extra = f", {r['pct_of_measured_matmul']:.1f}% of the measured matmul rate"
            say(name, f"{label}: fwd+bwd {t_fb * 1e3:.1f} ms, AdamW {t_opt * 1e3:.1f} ms, "
                      f"{seq / t:.0f} tok/s, MFU {r['mfu_pct']:.1f}% of 989 TFLOP/s{extra}, "
                      f"peak {peak / 2**30 if peak else 0:.1f} GiB, loss {loss:.3f}")
        except torch.cuda.OutOfMemoryError as e:
            res[label] = dict(error="OOM")
            say(name, f"{label}: out of memory ({str(e).splitlines()[0][:120]})")
        except Exception as e:
            res[label] = dict(error=repr(e)[:500])
            say(name, f"{label}: FAILED {e!r}"[:400])
            traceback.print_exc()
        opt.zero_grad(set_to_none=True)
        P.free()
    del model, opt
    P.free()

    # SDPA causal attention alone, Qwen3-4B training shape, per backend
    NQ, NKV, HD = (4, 2, 16) if P.small else (32, 8, 128)
    fwd_flops = 4 * seq * seq / 2 * HD * NQ
    bwd_flops = 2.5 * fwd_flops
    q = randn(P, 1, NQ, seq, HD, dtype=dt).requires_grad_()
    k = randn(P, 1, NKV, seq, HD, dtype=dt).requires_grad_()
    v = randn(P, 1, NKV, seq, HD, dtype=dt).requires_grad_()
    go = randn(P, 1, NQ, seq, HD, dtype=dt)
    att = res["sdpa"] = {}

    def fwd():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        fwd().backward(go)

    for label, be in sdpa_backends()[1:]:
        try:
            t_f = median_time(P, with_backend(be, fwd), *P.reps(10, 2))
            t_fb = median_time(P, with_backend(be, fwd_bwd), *P.reps(10, 2))
            t_b = max(t_fb - t_f, 1e-9)
            att[label] = dict(fwd_ms=t_f * 1e3, fwd_tflops=fwd_flops / t_f / 1e12,
                              bwd_ms=t_b * 1e3, bwd_tflops=bwd_flops / t_b / 1e12,
                              fwd_bwd_tflops=(fwd_flops + bwd_flops) / t_fb / 1e12)
            say(name, f"SDPA causal q[1,{NQ},{seq},{HD}] kv[1,{NKV},...] {label:9s}: fwd "
                      f"{t_f * 1e3:.3f} ms {att[label]['fwd_tflops']:.0f} TFLOP/s, bwd {t_b * 1e3:.3f} ms "
                      f"{att[label]['bwd_tflops']:.0f} TFLOP/s")
        except Exception as e:
            att[label] = dict(error=str(e).splitlines()[0][:200])
            say(name, f"SDPA {label}: not available ({str(e).splitlines()[0][:120]})")
        P.free()


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

def table(P):
    R = P.results
    lines = []
    c = R.get("ceilings", {})
    m = R["meta"]
    lines.append(f"device            {m.get('gpu', m.get('device'))}, torch {m.get('torch')}, CUDA {m.get('cuda')}")
    if "copy_bw" in c:
        lines.append(f"ceilings          copy {c['copy_bw'] / 1e9:.0f} GB/s, bf16 matmul "
                     f"{c['mm_flops'] / 1e12:.0f} TFLOP/s")
    for mm, f in R.get("gemm", {}).get("floor", {}).items():
        lines.append(f"GEMM floor M={mm:<4} {f['step_ms']:8.3f} ms/step {f['tok_s']:9.0f} tok/s")
    for B, r in R.get("decode", {}).get("batches", {}).items():
        if "eager_ms" in r:
            lines.append(f"decode B={B:<4}     eager {r['eager_tok_s']:7.0f} tok/s ({r['eager_roofline_pct']:4.1f}%)"
                         f"  graph {f1(r.get('graph_tok_s'), 0):>7} tok/s ({f1(r.get('graph_roofline_pct'))}%)"
                         f" of roofline")
        att = {k: v for k, v in r.get("attention", {}).items() if "pct_copy" in v}
        if att:
            lines.append(f"  SDPA attn B={B:<4} " + ", ".join(
                f"{k} {v['pct_copy']:.0f}%" for k, v in att.items()) + " of copy bandwidth")
        if "error" in r:
            lines.append(f"decode B={B:<4}     error: {r['error'][:60]}")
    g = R.get("gdn", {})
    for B, r in g.get("batches", {}).items():
        if "eager_ms" in r:
            lines.append(f"GDN layer B={B:<4}  eager {r['eager_ms']:7.3f} ms  graph "
                         f"{f1(r.get('graph_ms'), 3):>7} ms  ({f1(r.get('graph_pct_copy', r['eager_pct_copy']))}% of copy)")
    if "kernels_per_layer" in g:
        lines.append(f"GDN kernels/layer {g['kernels_per_layer']} (eager, B={g['profile_b']})")
    t = R.get("train", {})
    for label in ("recompute", "no_recompute"):
        r = t.get(label)
        if r and "tok_s" in r:
            pk = f"{r['peak_bytes'] / 2**30:.1f} GiB" if r.get("peak_bytes") else "-"
            lines.append(f"train {label:13s} {r['tok_s']:6.0f} tok/s, MFU {r['mfu_pct']:.1f}%, peak {pk}")
        elif r:
            lines.append(f"train {label:13s} {r.get('error', '')[:60]}")
    for label, r in t.get("sdpa", {}).items():
        if "fwd_tflops" in r:
            lines.append(f"SDPA train {label:9s} fwd {r['fwd_tflops']:.0f}, bwd {r['bwd_tflops']:.0f} TFLOP/s")
    errs = R.get("errors", {})
    if errs:
        lines.append("failed sections: " + ", ".join(errs))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes (a CPU run in seconds)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for probe.json")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ",".join(SECTIONS))
    ap.add_argument("--budget", type=float, default=150.0,
                    help="seconds; optional parts are skipped when little is left (default 150)")
    args = ap.parse_args()
    chosen = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in SECTIONS]
    if unknown:
        ap.error(f"unknown sections {unknown}; known: {SECTIONS}")
    P = Probe(args)
    say("probe", f"device {P.dev}, {'small' if P.small else 'full'} shapes, sections {chosen}")
    funcs = dict(ceilings=sec_ceilings, gemm=sec_gemm, decode=sec_decode, gdn=sec_gdn, train=sec_train)
    for sec in SECTIONS:
        if sec not in chosen:
            continue
        t0 = time.perf_counter()
        try:
            funcs[sec](P)
        except Exception as e:
            P.results["errors"][sec] = repr(e)[:1000]
            say(sec, f"FAILED: {e!r}"[:500])
            traceback.print_exc()
        P.free()
        dt = time.perf_counter() - t0
        P.results.setdefault("section_s", {})[sec] = dt
        say(sec, f"done in {dt:.1f} s (total {time.perf_counter() - START:.1f} s)")
        P.save()
    P.results["total_s"] = time.perf_counter() - START
    path = P.save()
    print("\n==== gpu-probe summary ====", flush=True)
    for line in table(P):
        print(line, flush=True)
    print(f"total {P.results['total_s']:.1f} s; every number in {path}", flush=True)


if __name__ == "__main__":
    main()
