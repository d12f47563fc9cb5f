#!/usr/bin/env bash
# `pipeline bench sample` against Hugging Face transformers `generate` (benches/hf_generate.py)
# on the same shapes and prompts, interleaved ROUNDS times (the machine's timings drift between
# runs, so the two sides alternate), each run the best of 3 as both benches do by default.
# Prints per batch the median decode tok/s of each side and their ratio. A benchmark helper that
# needs python3 with torch and transformers (PYTHON, default python3); CI does not run it.
#   bash scripts/vs-hf.sh ROUNDS SHAPE BATCHES [BIN]
#   PYTHON=/tmp/hf/bin/python bash scripts/vs-hf.sh 4 20m 1,8,32,64
set -euo pipefail
rounds=$1 shape=$2 batches=$3 bin=${4:-target/release/pipeline}
py=${PYTHON:-python3}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
row='/^ *[0-9]+ +[0-9.]+ +[0-9.]+/'
for _ in $(seq "$rounds"); do
  "$bin" bench sample --shape "$shape" --batch "$batches" 2>&1 | awk "$row {print \"ours\", \$1, \$3}" >> "$out"
  "$py" "$here/benches/hf_generate.py" --shape "$shape" --batch "$batches" 2>&1 |
    awk "$row {print \"transformers\", \$1, \$3}" >> "$out"
done
python3 - "$out" "$rounds" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, batch, tok = line.split()
    runs[(int(batch), side)].append(float(tok))
print(f"decode tok/s, medians of {sys.argv[2]} interleaved rounds (min-max)")
print(f"{'batch':>6} {'ours':>22} {'transformers':>22} {'ratio':>6}")
for batch in sorted({k[0] for k in runs}):
    o, t = runs[(batch, "ours")], runs[(batch, "transformers")]
    if not o or not t:
        continue
    mo, mt = statistics.median(o), statistics.median(t)
    span = lambda v: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
    print(f"{batch:>6} {span(o):>22} {span(t):>22} {mo / mt:>5.2f}x")
PY
