#!/usr/bin/env bash
# The GPU acceptance run (issue 35): the parts a lent GPU runs, in one device call, each step
# under a timeout, every log and figure under $OUT (one file per part; a device call brings back 8).
#
#   scripts/gpu-acceptance.sh PART...      PART: env | correctness | attention | speed | job |
#                                                probe | all
#
#   env          the driver, the GPU, the binary's libraries (ldd) and where they were found
#   correctness  tests/cuda.rs's executable (kernels, greedy = CPU incl. Qwen3.5, seeded samples,
#                the trainer's 8 steps = CPU, a killed GPU run resumed)
#   attention    bench attention: decode attention alone, every kernel version, bf16 and fp8 KV
#                (Qwen3-4B heads, batch 128 at context 2,176; batch 16 at 8,192)
#   speed        bench sample (Qwen3-4B shapes, batch 1..256, and at 1 and 32 without CUDA
#                graphs; Qwen3.5 shapes) and bench
#                train (Qwen3-4B, one 4,096-token row, recompute), GPU memory sampled throughout
#   job          whole `pipeline run all` jobs on random-weight checkpoints (`bench checkpoint`):
#                job-a samples MATH-500 at Qwen3-4B shapes, filters and evaluates, SIGKILLed
#                during sampling and resumed; job-b trains Qwen3-0.6B shapes on MATH-500's
#                reference solutions (a random model verifies nothing), SIGKILLed after its first
#                checkpoint and resumed, then evaluates base and trained. Per run: wall time,
#                GPU memory peak beside preflight's estimate, `pipeline status`.
#   probe        scripts/gpu-probe.py: the PyTorch peer on the same GPU (ceilings, cuBLAS at the
#                decode shapes, a Qwen3-4B decode step eager and as a CUDA graph, a Gated DeltaNet
#                layer, the Qwen3-4B fine-tune step); needs python3 with torch (skipped without)
#
# Environment (defaults in brackets):
#   OUT       where logs go [runs/acceptance]          DEVICE  cuda | cpu [cuda]
#   PIPELINE  the binary [.gpu/pipeline.xz unpacked, else target/release/pipeline]
#   CUDA_TESTS  tests/cuda.rs's executable [.gpu/cuda-tests.xz unpacked]
#   WORK      scratch: unpacked binaries, checkpoints, work dirs [a new temp dir]
#   SHARED    fixtures/ and data/ [.gpu/shared, else ../shared]
#   SMALL=1   tiny shapes and sizes: the script's own test on a CPU (tests/acceptance.rs)
#   JOBS      which jobs the job part runs ["a b"]
#   T_*       per-step timeouts in seconds (T_TESTS, T_BENCH, T_PEER, T_HYB, T_TRAIN, T_JOB, T_PROBE)
#   SPEED     which benchmarks the speed part runs ["sample eager hybrid train"]; SHYB, BATCH,
#             HYB_BATCH, EAGER_BATCH, NEW, HYB_NEW: its shapes and sizes; SPLIT: new tokens of the
#             run split by op [32]; `eager`: the sample benchmark with --enforce-eager (GPU only);
#             `peer`: mistral.rs's (PEER_PIPELINE, from `PEER=1 scripts/gpu-bundle.sh`) beside ours
# A step that fails or times out is logged as FAILED with its exit code; the script goes on to
# the next step and exits non-zero at the end if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/runs/acceptance}
DEVICE=${DEVICE:-cuda}
SMALL=${SMALL:-0}
mkdir -p "$OUT"
WORK=${WORK:-$(mktemp -d)}
# What travels to the GPU machine is stripped and xz-compressed (.gpu/*.xz, scripts/gpu-bundle.sh):
# unpacked into $WORK/bin, with Python's lzma where there is no xz; .gpu/ itself stays as it came.
for f in .gpu/*.xz; do
  [ -e "$f" ] && [ "$DEVICE" != cpu ] || continue
  mkdir -p "$WORK/bin"
  b=$WORK/bin/$(basename "${f%.xz}")
  if command -v xz >/dev/null; then
    xz -dc -T0 "$f" >"$b"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$f" "$b"
  fi
  chmod +x "$b"
done
if [ -z "${PIPELINE:-}" ]; then
  if [ -x "$WORK/bin/pipeline" ]; then PIPELINE=$WORK/bin/pipeline; else PIPELINE=$ROOT/target/release/pipeline; fi
fi
CUDA_TESTS=${CUDA_TESTS:-$WORK/bin/cuda-tests}
# the peer engine's binary (`PEER=1 scripts/gpu-bundle.sh`): timed beside ours where it came
PEER_PIPELINE=${PEER_PIPELINE:-$WORK/bin/pipeline-mistralrs}
if [ -z "${SHARED:-}" ]; then
  if [ -d .gpu/shared ]; then SHARED=$ROOT/.gpu/shared; else SHARED=$(cd .. && pwd)/shared; fi
fi
FAILED=0
JOBS=${JOBS:-a b}

if [ "$SMALL" = 1 ]; then
  S4B=tiny; SHYB=hybrid-20m; STRAIN=tiny; BATCH=1,4; HYB_BATCH=1,4; PROMPT=16; NEW=8; HYB_NEW=8
  REPEAT=1; SPLIT=4; ATTN=("--shape tiny --batch 4 --context 64 --iters 2")
  TRAIN_BENCH="--rows 1 --seq-len 64 --steps 1"
  JA_PROBLEMS=4; JA_N=2; JA_NEW=8; EVAL_LIMIT=2; EVAL_NEW=8
  JB_STEPS=4; JB_MICRO=512; JB_TOKENS=1024; JB_EVERY=2
else
  S4B=qwen3-4b; SHYB=${SHYB:-qwen3.5-4b}; STRAIN=qwen3-0.6b; BATCH=${BATCH:-1,32,128,256}
  HYB_BATCH=${HYB_BATCH:-1,32,128}; PROMPT=128; NEW=${NEW:-512}; HYB_NEW=${HYB_NEW:-256}; REPEAT=1
  SPLIT=${SPLIT:-32}
  TRAIN_BENCH="--rows 1 --seq-len 4096 --steps 2"
  ATTN=("--batch 128 --context 2176" "--batch 128 --context 2176 --kv-fp8"
    "--batch 16 --context 8192")
  JA_PROBLEMS=64; JA_N=4; JA_NEW=512; EVAL_LIMIT=32; EVAL_NEW=256
  JB_STEPS=20; JB_MICRO=4096; JB_TOKENS=8192; JB_EVERY=4
fi
T_TESTS=${T_TESTS:-150}
T_BENCH=${T_BENCH:-100}
# mistral.rs writes and loads its random checkpoint first
T_PEER=${T_PEER:-150}
T_TRAIN=${T_TRAIN:-80}
T_JOB=${T_JOB:-120}
T_PROBE=${T_PROBE:-200}
SPEED=${SPEED:-sample eager peer hybrid train}
EAGER_BATCH=${EAGER_BATCH:-1,32}

log() { echo "== $(date -u +%H:%M:%S) $*"; }
has_gpu() { [ "$DEVICE" != cpu ] && command -v nvidia-smi >/dev/null; }

# step NAME TIMEOUT CMD...: runs CMD under a timeout, sampling the GPU's used memory every
# 100 ms, and prints its wall time, exit code and the memory peak. EXPECT=137 (a SIGKILL the run
# injects into itself) makes that exit the success.
step() {
  local name=$1 limit=$2
  shift 2
  log "$name: $*"
  local smi="$WORK/smi.$$" pid=""
  if has_gpu; then
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >"$smi" 2>/dev/null &
    pid=$!
  fi
  local t0 rc
  t0=$(date +%s%N)
  timeout -k 5 "$limit" "$@"
  rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  local secs=$((ms / 1000)).$(printf %03d $((ms % 1000)))
  local peak="n/a"
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    peak="$(sort -n "$smi" | tail -1) MiB"
  fi
  if [ $rc -eq "${EXPECT:-0}" ]; then
    log "$name: ok (exit $rc) in ${secs}s, GPU memory peak $peak"
  else
    FAILED=1
    log "$name: FAILED (exit $rc$([ $rc -eq 124 ] && echo ", timed out after ${limit}s")) after ${secs}s, GPU memory peak $peak"
  fi
  [ $rc -eq "${EXPECT:-0}" ]
}

part_env() {
  log "host $(hostname), $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
  else
    echo "no nvidia-smi"
  fi
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  for b in "$PIPELINE" "$CUDA_TESTS"; do
    [ -x "$b" ] || { echo "$b: missing"; continue; }
    ls -la "$b"
    readelf -d "$b" 2>/dev/null | grep -E 'NEEDED|RPATH|RUNPATH'
    ldd "$b" | grep -Ei 'cuda|cublas|curand|nvrtc|not found'
  done
  "$PIPELINE" --version
}

part_correctness() {
  if [ ! -x "$CUDA_TESTS" ]; then
    log "correctness: FAILED: no test executable at $CUDA_TESTS"
    FAILED=1
    return
  fi
  SELFDISTILL_SHARED=$SHARED SELFDISTILL_PIPELINE=$PIPELINE step "tests/cuda.rs" "$T_TESTS" \
    "$CUDA_TESTS" --test-threads 1 --nocapture
}

part_attention() {
  local args
  for args in "${ATTN[@]}"; do
    # shellcheck disable=SC2086
    step "bench attention $args" 60 "$PIPELINE" bench attention --device "$DEVICE" $args
  done
}

part_speed() {
  [[ " $SPEED " == *" sample "* ]] && step "bench sample $S4B" "$T_BENCH" "$PIPELINE" bench sample \
    --device "$DEVICE" --shape "$S4B" --batch "$BATCH" --prompt-len "$PROMPT" --new-tokens "$NEW" \
    --repeat "$REPEAT" --split-tokens "$SPLIT"
  # the same decode without CUDA graphs, beside the replayed one (a GPU's only: no graphs on a CPU)
  [[ " $SPEED " == *" eager "* ]] && [ "$DEVICE" != cpu ] && step "bench sample $S4B eager" \
    "$T_BENCH" "$PIPELINE" bench sample --device "$DEVICE" --shape "$S4B" --batch "$EAGER_BATCH" \
    --prompt-len "$PROMPT" --new-tokens "$NEW" --repeat "$REPEAT" --enforce-eager
  # mistral.rs on the same shapes, where its binary came (a line says so where it did not)
  if [[ " $SPEED " == *" peer "* ]]; then
    if [ -x "$PEER_PIPELINE" ] && [ "$DEVICE" != cpu ]; then
      step "bench sample $S4B mistralrs" "$T_PEER" "$PEER_PIPELINE" bench sample --engine mistralrs \
        --device "$DEVICE" --shape "$S4B" --batch "$BATCH" --prompt-len "$PROMPT" --new-tokens "$NEW" \
        --repeat "$REPEAT"
      step "bench sample $SHYB mistralrs" "$T_PEER" "$PEER_PIPELINE" bench sample \
        --engine mistralrs --device "$DEVICE" --shape "$SHYB" --batch "$HYB_BATCH" \
        --prompt-len "$PROMPT" --new-tokens "$HYB_NEW" --repeat "$REPEAT"
    else
      log "peer: skipped: no mistral.rs binary at $PEER_PIPELINE (PEER=1 scripts/gpu-bundle.sh)"
    fi
  fi
  [[ " $SPEED " == *" hybrid "* ]] && step "bench sample $SHYB" "${T_HYB:-90}" "$PIPELINE" bench sample \
    --device "$DEVICE" --shape "$SHYB" --batch "$HYB_BATCH" --prompt-len "$PROMPT" \
    --new-tokens "$HYB_NEW" --repeat "$REPEAT" --split-tokens "$SPLIT"
  [[ " $SPEED " == *" train "* ]] && step "bench train $S4B" "$T_TRAIN" "$PIPELINE" bench train \
    --device "$DEVICE" --shape "$S4B" $TRAIN_BENCH --recompute-only
  return 0
}

part_probe() {
  if ! python3 -c 'import torch' 2>/dev/null; then
    log "probe: skipped: python3 has no torch"
    return
  fi
  local small=()
  [ "$SMALL" = 1 ] && small=(--small)
  PYTHONUNBUFFERED=1 step "gpu-probe.py" "$T_PROBE" python3 scripts/gpu-probe.py "${small[@]}" --out "$OUT"
}

# A local eval set over MATH-500 (the shipped ones read the hub; the GPU machine is offline),
# with the raw template: a random checkpoint has no chat template.
write_eval_set() {
  cat >"$WORK/math500_local.toml" <<EOF
[source]
name = "math500"
format = "math"
path = "$SHARED/data/math500.jsonl"
[sample]
prompt_template = "raw"
n = 1
temperature = 0.6
top_p = 0.95
top_k = 20
max_new_tokens = $EVAL_NEW
seed = 0
EOF
}

# The head of a job's config: its name, work dir and MATH-500 (`limit` rows when given).
job_head() {
  cat <<EOF
[run]
name = "$1"
workdir = "$WORK/$1"
[[data.sources]]
name = "math500"
format = "math"
path = "$SHARED/data/math500.jsonl"
${2:+limit = $2}
EOF
}

# The [eval] of both jobs: the local MATH-500 set on the job's device.
job_eval() {
  cat <<EOF
[eval]
sets = ["$WORK/math500_local.toml"]
limit = $EVAL_LIMIT
device = "$DEVICE"
max_num_seqs = 256
EOF
}

# run_job NAME KILL_POINT WHEN: preflight, a run SIGKILLed at KILL_POINT, the resume, the
# status; then the job's model and work dir go (the disk for the next job).
run_job() {
  local cfg="$WORK/$1.toml"
  step "preflight $1" 60 "$PIPELINE" preflight --config "$cfg"
  EXPECT=137 SELFDISTILL_KILL_AT=$2 step "$1, SIGKILLed $3" "$T_JOB" \
    "$PIPELINE" run all --config "$cfg"
  step "$1, resumed" "$T_JOB" "$PIPELINE" run all --config "$cfg"
  "$PIPELINE" status --config "$cfg"
  tail -n 3 "$WORK/$1"/stages/train*/train_state/metrics.jsonl 2>/dev/null
  rm -rf "$WORK/model-${1#job-}" "$WORK/$1"
}

part_job() {
  write_eval_set
  if [[ " $JOBS " == *" a "* ]]; then
    step "bench checkpoint $S4B" 120 "$PIPELINE" bench checkpoint --shape "$S4B" --dtype bf16 \
      --output "$WORK/model-a" || return
    {
      job_head job-a "$JA_PROBLEMS"
      cat <<EOF
[sample]
model = "$WORK/model-a"
prompt_template = "raw"
n = $JA_N
temperature = 0.6
top_p = 0.95
top_k = 20
max_new_tokens = $JA_NEW
seed = 0
device = "$DEVICE"
max_num_seqs = 256
max_num_batched_tokens = 8192
[filter]
# the only local set is both the data and the eval set: a speed job, not a result
decontaminate = false
EOF
      job_eval
    } >"$WORK/job-a.toml"
    run_job job-a sample.part:1 "after the first part"
  fi
  if [[ " $JOBS " == *" b "* ]]; then
    step "bench checkpoint $STRAIN" 60 "$PIPELINE" bench checkpoint --shape "$STRAIN" \
      --dtype bf16 --output "$WORK/model-b" || return
    {
      job_head job-b
      cat <<EOF
[filter]
decontaminate = false
[filter.completions]
path = "$SHARED/data/math500.jsonl"
format = "math"
completion_field = "solution"
source = "math500"
[train]
model = "$WORK/model-b"
device = "$DEVICE"
lr = 1e-5
max_steps = $JB_STEPS
tokens_per_step = $JB_TOKENS
micro_batch_tokens = $JB_MICRO
max_seq_len = $JB_MICRO
recompute = true
loss_chunk_tokens = 1024
checkpoint_every = $JB_EVERY
EOF
      job_eval
    } >"$WORK/job-b.toml"
    run_job job-b train.after_checkpoint:1 "after the first checkpoint"
  fi
}

[ $# -gt 0 ] || { sed -n '2,37p' "$0"; exit 2; }
parts=("$@")
[ "${parts[*]}" = all ] && parts=(env correctness attention speed job probe)
if [ "$DEVICE" != cpu ] && [ -f scripts/gpu-env.sh ]; then
  # shellcheck disable=SC1091
  source scripts/gpu-env.sh >"$OUT/gpu-env.log" 2>&1
fi
for p in "${parts[@]}"; do
  case $p in
    env | correctness | attention | speed | job | probe) "part_$p" 2>&1 | tee "$OUT/$p.log" ;;
    *) echo "unknown part $p (env | correctness | attention | speed | job | probe | all)" >&2; exit 2 ;;
  esac
  # a part runs in a pipeline's subshell: its failures are read back from its log
  grep -q ': FAILED' "$OUT/$p.log" && FAILED=1
done
for p in "${parts[@]}"; do grep -h '^== .*: \(ok\|FAILED\)' "$OUT/$p.log"; done >"$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $FAILED
