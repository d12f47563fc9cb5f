#!/usr/bin/env bash
# The test command: installs what the tests need (pyarrow, to check our Parquet files read in
# pyarrow; tensorboard, to check our event files read in TensorBoard) and runs the whole test suite, the mistral.rs engine included (one test build with
# `--features mistralrs`, so that CI compiles one set of features, not two). Works on a fresh
# machine with Rust and Python 3.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import pyarrow' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check pyarrow
fi
# TensorBoard's own event loader reads the event files we write.
if ! python3 -c 'import tensorboard' 2>/dev/null; then
  python3 -m pip install --quiet --disable-pip-version-check tensorboard
fi
# Tests that read ../shared or need pyarrow or tensorboard fail instead of skipping.
export SELFDISTILL_REQUIRE_PYARROW=1 SELFDISTILL_REQUIRE_SHARED=1 SELFDISTILL_REQUIRE_TENSORBOARD=1
cargo test --all-targets --features mistralrs "$@"
