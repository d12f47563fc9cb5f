#!/usr/bin/env bash
# `pipeline bench sample` against other engines on the same shapes and prompts, interleaved ROUNDS
# times (the machine's timings drift between runs, so the sides alternate), each run the best of 3
# as every bench does by default. Sides (ENGINES, default "ours mistralrs transformers"):
#   ours          pipeline bench sample
#   mistralrs     pipeline bench sample --engine mistralrs (a binary built with --features
#                 mistralrs; mistral.rs's own sampler on the same random weights as ours)
#   transformers  benches/hf_generate.py (python3 with torch and transformers: PYTHON)
# Prints per batch the median decode tok/s of each side (min-max) and each side's ratio to ours.
# A benchmark helper; CI does not run it.
#   bash scripts/vs-engines.sh ROUNDS SHAPE BATCHES [BIN]
#   PYTHON=/tmp/hf/bin/python bash scripts/vs-engines.sh 5 20m 1,8,32,64 target/release/pipeline
set -euo pipefail
rounds=$1 shape=$2 batches=$3 bin=${4:-target/release/pipeline}
py=${PYTHON:-python3}
engines=${ENGINES:-ours mistralrs transformers}
here=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
row='/^ *[0-9]+ +[0-9.]+ +[0-9.]+/'
for _ in $(seq "$rounds"); do
  for side in $engines; do
    case $side in
      ours) "$bin" bench sample --shape "$shape" --batch "$batches" ;;
      mistralrs) "$bin" bench sample --engine mistralrs --shape "$shape" --batch "$batches" ;;
      transformers) "$py" "$here/benches/hf_generate.py" --shape "$shape" --batch "$batches" ;;
      *) echo "unknown side $side" >&2; exit 2 ;;
    esac 2>&1 | awk "$row {print \"$side\", \$1, \$3}" >> "$out"
  done
done
python3 - "$out" "$rounds" "$engines" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, batch, tok = line.split()
    runs[(int(batch), side)].append(float(tok))
sides = sys.argv[3].split()
print(f"decode tok/s, medians of {sys.argv[2]} interleaved rounds (min-max); x = ours / side")
print(f"{'batch':>6} " + " ".join(f"{s:>22}" for s in sides))
for batch in sorted({k[0] for k in runs}):
    cells, ours = [], runs.get((batch, "ours"))
    for s in sides:
        v = runs.get((batch, s))
        if not v:
            cells.append(f"{'-':>22}")
            continue
        cell = f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
        if ours and s != "ours":
            cell += f" {statistics.median(ours) / statistics.median(v):.2f}x"
        cells.append(f"{cell:>22}")
    print(f"{batch:>6} " + " ".join(cells))
PY
