#!/usr/bin/env bash
# Our kernels on GPUs we have not run on: each kernels/*.cu compiled to PTX as build.rs compiles
# it (compute_90), then assembled by ptxas for sm_90 (H100/H200), sm_100 (B200) and sm_120, as the
# driver's JIT assembles it on such a GPU. Fails on the first kernel file that does not
# assemble. Needs the CUDA toolkit of scripts/cuda-toolchain.sh (no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
CUDA_HOME=${CUDA_HOME:-$(bash scripts/cuda-toolchain.sh)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for src in kernels/*.cu; do
  name=$(basename "$src" .cu)
  "$CUDA_HOME/bin/nvcc" --ptx -arch=compute_90 -O3 -std=c++17 -o "$tmp/$name.ptx" "$src"
  for arch in sm_90 sm_100 sm_120; do
    "$CUDA_HOME/bin/ptxas" -arch="$arch" -O3 -o "$tmp/$name.$arch.cubin" "$tmp/$name.ptx"
  done
  echo "ptx-check: $name assembles for sm_90, sm_100, sm_120"
done
