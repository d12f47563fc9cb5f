#!/usr/bin/env bash
# Interleaved A/B of `pipeline bench sample` between builds, for machines whose timings drift
# (shared caches and memory: the same binary's figures can move by 40% between runs). Runs each
# binary in turn, ROUNDS times, one repeat per run, and prints per batch the median, min and max
# decode tok/s of each. A benchmark helper: CI does not run it.
#   bash scripts/ab-sample.sh ROUNDS BATCHES BIN_A BIN_B [BIN ...] [-- extra bench args]
#   bash scripts/ab-sample.sh 6 32,64 /tmp/pipeline-old target/release/pipeline -- --shape 20m
set -euo pipefail
rounds=$1 batches=$2
shift 2
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#bins[@]} -ge 2 ] || { echo "usage: $0 ROUNDS BATCHES BIN_A BIN_B [BIN ...] [-- bench args]" >&2; exit 2; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
  for b in "${bins[@]}"; do
    "$b" bench sample --batch "$batches" --repeat 1 "$@" 2>&1 |
      awk -v b="$b" '/^ *[0-9]+ +[0-9.]+ +[0-9.]+/ {print b, $1, $3}' >> "$out"
  done
done
python3 - "$out" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
order = []
for line in open(sys.argv[1]):
    b, batch, tok = line.split()
    if b not in order:
        order.append(b)
    runs[(int(batch), b)].append(float(tok))
print(f"{'batch':>6} {'median':>9} {'min':>9} {'max':>9}  binary (decode tok/s)")
for batch in sorted({k[0] for k in runs}):
    for b in order:
        v = runs.get((batch, b))
        if v:
            print(f"{batch:>6} {statistics.median(v):>9.0f} {min(v):>9.0f} {max(v):>9.0f}  {b}")
PY
