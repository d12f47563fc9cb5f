#!/usr/bin/env bash
# Submits a self-distillation run to Slurm: the sample stage on N GPUs (an array of N tasks, one
# shard each), then the rest of the pipeline on one GPU once every shard has succeeded.
#
#   deploy/slurm.sh pipelines/qwen3-4b-gsm8k.toml 8 [more sbatch options, e.g. --partition=gpu]
#
# Watch it from any node: pipeline status --config CONFIG --watch
set -euo pipefail
config=${1:?usage: slurm.sh CONFIG N [sbatch options]}
n=${2:?usage: slurm.sh CONFIG N [sbatch options]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
"${PIPELINE:-pipeline}" preflight --config "$config" --plan-only
array=$(sbatch --parsable --array=0-$((n - 1)) "$@" "$here/slurm-sample.sbatch" "$config")
rest=$(sbatch --parsable --dependency=afterok:"${array%%;*}" "$@" "$here/slurm-rest.sbatch" "$config")
echo "sampling: array job $array ($n shards); the rest: job $rest"
