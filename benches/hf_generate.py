"""Hugging Face transformers `generate` on CPU, side by side with `pipeline bench sample`.

Builds a randomly initialised Qwen3 of the same shapes as `pipeline bench sample --shape`
(tiny, 20m, qwen3-0.6b), feeds the same kind of prompts (fixed length, batch of B), generates a
fixed number of tokens greedily (min_new_tokens = max_new_tokens, so EOS never stops it early)
and prints prefill and decode tokens/s per batch size. Prefill is timed as a generate of one
token; decode as the difference between generating N+1 tokens and one token. Like `pipeline
bench sample`, each figure is the best of `--repeat` runs (the machine's noise only ever slows a
run), so the two sides are measured the same way.

Needs python3 with torch and transformers; CI does not run it. Usage:
    python3 benches/hf_generate.py --shape 20m --batch 1,8,32,64 --prompt-len 64 --new-tokens 32
"""
import argparse
import time

SHAPES = {
    # hidden, intermediate, layers, heads, kv heads, head_dim, vocab
    "tiny": (64, 176, 2, 4, 2, 16, 485),
    "20m": (256, 768, 8, 8, 4, 32, 32000),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936),
}


def build(shape):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    h, i, l, q, kv, d, v = SHAPES[shape]
    cfg = Qwen3Config(
        hidden_size=h, intermediate_size=i, num_hidden_layers=l, num_attention_heads=q,
        num_key_value_heads=kv, head_dim=d, vocab_size=v, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, torch_dtype="float32",
    )
    torch.manual_seed(0)
    return Qwen3ForCausalLM(cfg).eval(), v


def timed(model, vocab, batch, prompt_len, new):
    import torch

    ids = torch.tensor(
        [[(b * 7919 + t * 104729) % vocab for t in range(prompt_len)] for b in range(batch)]
    )
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        t0 = time.perf_counter()
        model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=new,
            min_new_tokens=new, pad_token_id=0,
        )
        return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="20m", choices=sorted(SHAPES))
    ap.add_argument("--batch", default="1,8,32,64")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3, help="runs per batch size; the best is reported")
    a = ap.parse_args()
    import torch

    model, vocab = build(a.shape)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"transformers generate, shape {a.shape} ({params:.1f}M parameters, f32, "
          f"{torch.get_num_threads()} threads), prompt {a.prompt_len}, {a.new_tokens} new tokens, "
          f"best of {a.repeat} runs")
    print(f"{'batch':>6} {'prefill tok/s':>14} {'decode tok/s':>14}")
    for b in [int(x) for x in a.batch.split(",")]:
        timed(model, vocab, b, a.prompt_len, 2)  # warm-up
        t1 = min(timed(model, vocab, b, a.prompt_len, 1) for _ in range(a.repeat))
        tn = min(timed(model, vocab, b, a.prompt_len, a.new_tokens + 1) for _ in range(a.repeat))
        print(f"{b:>6} {b * a.prompt_len / t1:>14.1f} {b * a.new_tokens / max(tn - t1, 1e-9):>14.1f}")


if __name__ == "__main__":
    main()
