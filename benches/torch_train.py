"""PyTorch eager training steps on CPU, side by side with `pipeline bench train`.

Builds a randomly initialised Qwen3 (transformers) of the same shapes as
`pipeline bench train --shape` (tiny, arith, 20m, 50m, qwen3-0.6b), and times the same step: forward and
backward over ROWS rows of SEQ_LEN tokens (the first quarter of each row is prompt, masked from
the loss with -100, so the loss is the mean over completion tokens), gradient clipping to 1.0,
then torch.optim.AdamW. f32, eager (no torch.compile), SDPA attention, the default thread count
(set OMP_NUM_THREADS / torch.set_num_threads to match). Prints tokens/s and the peak RSS growth
of the timed steps.

Needs python3 with torch and transformers; CI does not run it. Usage:
    python3 benches/torch_train.py --shape 50m --rows 8 --seq-len 256 --steps 3
"""
import argparse
import resource
import time

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, head_dim, vocab
    "tiny": (64, 176, 2, 4, 2, 16, 485),
    "arith": (128, 384, 4, 4, 4, 32, 72),
    "20m": (256, 768, 8, 8, 4, 32, 32000),
    "50m": (512, 1536, 10, 8, 4, 64, 32000),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
}


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def peak_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="50m", choices=sorted(SHAPES))
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    h, i, l, q, kv, d, v = SHAPES[a.shape]
    cfg = Qwen3Config(
        hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=q,
        num_key_value_heads=kv, head_dim=d, vocab_size=v, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, torch_dtype="float32",
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).train()
    params = sum(p.numel() for p in model.parameters())
    prompt = a.seq_len // 4
    ids = torch.tensor(
        [[(r * 7919 + t * 104729) % v for t in range(a.seq_len)] for r in range(a.rows)]
    )
    labels = ids.clone()
    labels[:, :prompt] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, betas=(0.9, 0.95), weight_decay=0.1)

    def step():
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up (also allocates the optimizer state)
    before = rss_bytes()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    secs = (time.perf_counter() - t0) / a.steps
    tokens = a.rows * a.seq_len
    print(
        f"torch {torch.__version__} eager train, shape {a.shape} ({params / 1e6:.1f}M parameters, "
        f"f32, {torch.get_num_threads()} threads), {a.rows} rows x {a.seq_len} tokens: "
        f"{tokens / secs:.0f} tokens/s, step peak {(peak_bytes() - before) / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
