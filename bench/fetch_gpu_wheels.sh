#!/usr/bin/env bash
# Download, here, the wheels bench/gpu_check.sh can use on the GPU machine (which has no network):
# sgl-flash-mla 1.0.0 (~10 MB, the FlashMLA kernels SGLang's flashmla_kv decode calls) into .whl/,
# ignored by git (.git/info/exclude). Carry .whl with the device tool's `run`. The wheel declares
# torch>=2.14.1; whether it loads on the GPU machine's torch is one of the things the check reports.
set -euo pipefail
cd "$(dirname "$0")/.."
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx "/.whl/" "$ex" 2>/dev/null || echo "/.whl/" >> "$ex"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl sgl-flash-mla==1.0.0
ls -la .whl
