#!/usr/bin/env bash
# Source this on a GPU machine before running a binary built with `--features cuda` elsewhere:
# it puts the directories holding the machine's own libcuda, cuBLAS, cuBLASLt, cuRAND, NVRTC and
# CUDA runtime on LD_LIBRARY_PATH (the binary was linked against stubs and carries no rpath).
#
#   source scripts/gpu-env.sh && ./pipeline bench sample --device cuda ...
#
# Looks in the usual places: the driver's folders, /usr/local/cuda*, and the nvidia-* Python
# wheels (PyTorch's). Prints what it found and what it did not; exits non-zero when any is missing.
_sd_missing=0
_sd_dirs=""
for _sd_lib in libcuda.so.1 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libcudart.so.13; do
  _sd_found=""
  for _sd_d in /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64; do
    if [ -e "$_sd_d/$_sd_lib" ]; then _sd_found=$_sd_d; break; fi
  done
  if [ -z "$_sd_found" ]; then
    _sd_found=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$_sd_lib" -print 2>/dev/null | head -1)
    _sd_found=${_sd_found%/*}
  fi
  if [ -z "$_sd_found" ]; then
    echo "gpu-env: $_sd_lib not found" >&2
    _sd_missing=1
  else
    echo "gpu-env: $_sd_lib in $_sd_found" >&2
    case ":$_sd_dirs:" in *":$_sd_found:"*) ;; *) _sd_dirs="$_sd_dirs:$_sd_found" ;; esac
  fi
done
export LD_LIBRARY_PATH="${_sd_dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ "$_sd_missing" = 0 ]
