#!/usr/bin/env bash
# Builds what `scripts/gpu-acceptance.sh` runs on a lent GPU machine into .gpu/ (git-ignored; a
# device call carries it): the release `pipeline` with `--features cuda` (PTX for compute
# capability ${CUDA_COMPUTE_CAP:-90}) and tests/cuda.rs's executable, stripped and xz-compressed,
# and the few files of ../shared they read (fixtures, MATH-500, GSM8K train). Prints the sizes.
#
#   bash scripts/gpu-bundle.sh        # then carry .gpu: scripts/gpu-acceptance.sh all
#   PEER=1 bash scripts/gpu-bundle.sh # also pipeline-mistralrs (--features cuda,mistralrs: the
#                                     # peer engine, which the speed part then times beside ours;
#                                     # a long release build on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_HOME=$(bash scripts/cuda-toolchain.sh)
export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
peer=
if [ "${PEER:-0}" = 1 ]; then
  # first: the cuda-only build below writes target/release/pipeline again
  cargo build --release --features cuda,mistralrs
  peer=$(mktemp)
  strip -o "$peer" target/release/pipeline
fi
tests=$(cargo test --release --features cuda --test cuda --no-run --message-format=json |
  python3 -c 'import json, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])')
[ -x "$tests" ] || { echo "gpu-bundle: no test executable" >&2; exit 1; }
SHARED=${SHARED:-../shared}
rm -rf .gpu
mkdir -p .gpu/shared/data
if [ -n "$peer" ]; then
  mv "$peer" .gpu/pipeline-mistralrs
  xz -T0 -6 .gpu/pipeline-mistralrs
fi
strip -o .gpu/pipeline target/release/pipeline
strip -o .gpu/cuda-tests "$tests"
xz -T0 -6 .gpu/pipeline .gpu/cuda-tests
cp -r "$SHARED/fixtures" .gpu/shared/
cp "$SHARED/data/math500.jsonl" "$SHARED/data/gsm8k_train.jsonl" .gpu/shared/data/
du -sh .gpu/* .gpu
