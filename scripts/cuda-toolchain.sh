#!/usr/bin/env bash
# Installs NVIDIA's CUDA 13.0 compiler toolchain from PyPI wheels into a cache directory and
# prints that directory, which then works as CUDA_HOME for `cargo build --features cuda` on a
# machine with no GPU and no system CUDA.
#
#   CUDA_HOME=$(bash scripts/cuda-toolchain.sh) && export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
#
# What it makes, under ${SELFDISTILL_CUDA_HOME:-~/.cache/selfdistill/cuda-13.0}:
#   bin/nvcc, nvvm/, include/ (+ cccl), lib/libcudart.so  from the wheels (pinned to 13.0.x: the GPU
#       machines run driver 580 = CUDA 13.0, which rejects PTX written by a newer toolkit)
#   lib/stubs/lib{cuda,nvrtc,curand,cublas,cublasLt}.so   link-time stubs: every entry point
#       cudarc declares, as an empty function, under the real library's soname. They exist only so
#       the linker can resolve names; the binary loads the GPU machine's own libraries at run time
#       (see docs/gpu.md) and carries no rpath to this directory.
# Re-running is cheap: a finished install is marked by .complete and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${SELFDISTILL_CUDA_HOME:-$HOME/.cache/selfdistill/cuda-13.0}
CUDARC_VERSION=0.19.10

if [ -f "$DEST/.complete" ] && [ -x "$DEST/bin/nvcc" ]; then
  echo "$DEST"
  exit 0
fi

log() { echo "cuda-toolchain: $*" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

log "downloading the CUDA 13.0 wheels"
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_12_x86_64 -d "$tmp/whl" \
  'nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-nvvm==13.0.*' \
  'nvidia-cuda-crt==13.0.*' 'nvidia-cuda-cccl==13.0.*' >&2
for w in "$tmp"/whl/*.whl; do
  python3 -m zipfile -e "$w" "$tmp/x" >&2
done
root="$tmp/x/nvidia/cu13"
[ -f "$root/bin/nvcc" ] || { log "the wheels did not unpack to nvidia/cu13/bin/nvcc"; exit 1; }
chmod +x "$root"/bin/* "$root"/nvvm/bin/* 2>/dev/null || true
chmod +x "$root/bin/crt"/* 2>/dev/null || true
ln -sf libcudart.so.13 "$root/lib/libcudart.so"
ln -sfn lib "$root/lib64"

# Link-time stubs, from the entry points cudarc loads by name.
log "writing link-time stubs"
cudarc_src=""
for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-$CUDARC_VERSION/src; do
  [ -d "$d" ] && cudarc_src=$d
done
if [ -z "$cudarc_src" ]; then
  cargo fetch --locked >&2
  for d in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-$CUDARC_VERSION/src; do
    [ -d "$d" ] && cudarc_src=$d
  done
fi
[ -n "$cudarc_src" ] || { log "cudarc $CUDARC_VERSION sources not found after cargo fetch"; exit 1; }
mkdir -p "$root/lib/stubs"
stub() { # stub LIBNAME SONAME SYS_DIR
  local c="$tmp/$1.c"
  grep -oh 'load::<_F>("[A-Za-z0-9_]*")' "$cudarc_src/$3/sys/mod.rs" | sed 's/.*("\(.*\)")/\1/' |
    sort -u | sed 's/.*/void &(void) {}/' >"$c"
  [ -s "$c" ] || { log "no entry points found for $1 in $cudarc_src/$3"; exit 1; }
  cc -shared -fPIC -Wl,-soname,"$2" -o "$root/lib/stubs/$1.so" "$c"
}
stub libcuda libcuda.so.1 driver
stub libnvrtc libnvrtc.so.13 nvrtc
stub libcurand libcurand.so.10 curand
stub libcublas libcublas.so.13 cublas
stub libcublasLt libcublasLt.so.13 cublaslt

"$root/bin/nvcc" --version | grep -q 'release 13.0' || { log "nvcc is not 13.0"; exit 1; }
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.partial" "$DEST"
mv "$root" "$DEST.partial"
touch "$DEST.partial/.complete"
mv "$DEST.partial" "$DEST"
log "installed in $DEST"
echo "$DEST"
