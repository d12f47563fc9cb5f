#!/usr/bin/env bash
# Ours against Hugging Face transformers `generate` only: scripts/vs-engines.sh with
# ENGINES="ours transformers" (same arguments).
#   PYTHON=/tmp/hf/bin/python bash scripts/vs-hf.sh 4 20m 1,8,32,64
ENGINES="ours transformers" exec bash "$(dirname "$0")/vs-engines.sh" "$@"
