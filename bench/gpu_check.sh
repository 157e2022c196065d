#!/usr/bin/env bash
# The prepared GPU check, for a session that is lent a GPU machine (one run, ~2 minutes):
# the CUDA tests (Triton FlashTrans zero-copy over pinned host memory, resolver on CUDA vs the
# oracle), the CPU store/attention tests on that machine's torch, and the store benchmark on
# CUDA. Needs only torch, triton and pytest (no sglang). Logs and JSON go to $OUT (or ./gpu_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available())" | tee "$OUT/versions.txt"
python3 -m pytest -q -rs -p no:cacheprovider tests/gpu tests/unit/store tests/unit/attention 2>&1 | tee "$OUT/gpu_tests.log"
python3 -m bench store --device cuda --oracle-steps 2 2>&1 | tee "$OUT/store_cuda.log"
cp bench/results/store.json "$OUT/store_cuda.json" 2>/dev/null || true
