#!/usr/bin/env bash
# Download, here, the wheels bench/gpu_check.sh needs on the lent GPU machine, which has Python 3.12,
# torch 2.11, Triton 3.6, transformers, numpy, numba, prometheus-client, uvloop, psutil, requests,
# aiohttp - and no network, no SGLang, fastapi, uvicorn, pyzmq, orjson, pydantic or FlashMLA.
#
#   bash bench/fetch_gpu_wheels.sh [--with-flashmla] [--budget-mib N]
#
# Fetches into .whl/ (ignored by git through .git/info/exclude; the device tool's `run` carries it
# with carry: [".whl"]): SGLang 0.5.23 (cp312) and every runtime package it imports that the GPU
# machine lacks, at the versions this checkout's CPU environment (.venv, launch/setup.sh) runs and
# tests, so the two machines run the same SGLang stack. Not fetched, and said so at the end:
#   * sgl-kernel (SGLang's CUDA kernels, hundreds of MB: over the budget by itself) - gpu_check.sh
#     puts this repo's torch stand-ins (launch/cpu_shims/sgl_kernel) on PYTHONPATH instead;
#   * sgl-flash-mla (~10 MB, FlashMLA) unless --with-flashmla: it declares torch>=2.14.1 and the
#     GPU machine has 2.11, so whether it loads there is one of the things the check reports.
# Prints each wheel's size, the total, the working tree's size and what is left of the 64 MiB that
# travel; exits 3 if the bundle plus the tree is over the budget (nothing is silently dropped), 4 if a
# wheel was not found for cp312, 2 on a bad argument.
set -euo pipefail
cd "$(dirname "$0")/.."
FLASHMLA=0
BUDGET_MIB=64
while [ $# -gt 0 ]; do
  case "$1" in
    --with-flashmla) FLASHMLA=1 ;;
    --budget-mib) BUDGET_MIB=$2; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "fetch_gpu_wheels: unknown argument $1 (expected --with-flashmla, --budget-mib N)" >&2; exit 2 ;;
  esac
  shift
done
ex=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$ex")"
grep -qx "/.whl/" "$ex" 2>/dev/null || echo "/.whl/" >> "$ex"

# What SGLang 0.5.23 imports to serve that the GPU machine's image lacks (KINDS.md's package list):
# the server (fastapi, starlette, uvicorn, pydantic, python-multipart, orjson, pyzmq, msgspec,
# pybase64, setproctitle), the grammar and tool parsers (xgrammar, apache-tvm-ffi,
# partial-json-parser, jsonschema), the model config stack (compressed-tensors, gguf), the OpenAI
# protocol types (openai, distro, jiter, sniffio) and IPython (sglang.lang's interpreter imports it).
PACKAGES="sglang orjson pybase64 msgspec fastapi starlette pydantic pydantic_core annotated-types
typing-inspection uvicorn pyzmq setproctitle python-multipart partial-json-parser apache-tvm-ffi
compressed-tensors gguf openai distro jiter sniffio jsonschema jsonschema-specifications referencing
rpds-py xgrammar ipython ipython_pygments_lexers jedi parso prompt_toolkit traitlets decorator
matplotlib-inline pexpect ptyprocess stack-data asttokens executing pure_eval wcwidth"
# versions: this checkout's CPU environment (what the test suite ran), else these pins
declare -A PIN=([sglang]=0.5.23 [xgrammar]=0.2.7 [apache-tvm-ffi]=0.1.11 [compressed-tensors]=0.18.0
                [openai]=2.8.0 [decorator]=5.2.1)
FREEZE=""
if [ -x .venv/bin/python ]; then FREEZE=$(.venv/bin/python -m pip freeze 2>/dev/null || true); fi
norm() { echo "$1" | tr 'A-Z_.' 'a-z--'; }
specs=()
for p in $PACKAGES; do
  v=$(echo "$FREEZE" | awk -F'==' -v n="$(norm "$p")" '{k=tolower($1); gsub(/[_.]/,"-",k)} k==n {print $2}')
  v=${v:-${PIN[$p]:-}}
  if [ -n "$v" ]; then specs+=("$p==$v"); else specs+=("$p"); fi
done
[ "$FLASHMLA" = 1 ] && specs+=("sgl-flash-mla==1.0.0")

rm -rf .whl && mkdir -p .whl
echo "[fetch] ${#specs[@]} wheels for cp312 / manylinux x86_64 into .whl/"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${specs[@]}" 2>&1 | grep -v "^WARNING: Location" || true
missing=()
for s in "${specs[@]}"; do
  n=$(norm "${s%%==*}")
  ls .whl | tr 'A-Z_.' 'a-z--' | grep -q "^${n}-[0-9]" || missing+=("$s")
done
ls -l .whl | awk 'NR>1 {printf "  %8.2f MiB  %s\n", $5/1048576, $9}'
bundle=$(du -cb .whl/*.whl 2>/dev/null | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
python3 - "$bundle" "$tree" "$BUDGET_MIB" <<'EOF'
import sys
bundle, tree, budget = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
mib = 1 << 20
left = budget * mib - bundle - tree
print(f"[fetch] bundle {bundle / mib:.2f} MiB + working tree {tree / mib:.2f} MiB = {(bundle + tree) / mib:.2f} MiB "
      f"of {budget:g} MiB ({left / mib:.2f} MiB left)")
EOF
echo "[fetch] left out: sgl-kernel (SGLang's CUDA kernels; gpu_check.sh uses launch/cpu_shims/sgl_kernel, torch)"
[ "$FLASHMLA" = 1 ] || echo "[fetch] left out: sgl-flash-mla (add --with-flashmla; it declares torch>=2.14.1, the GPU machine has 2.11)"
if [ ${#missing[@]} -gt 0 ]; then
  echo "[fetch] NOT FOUND for cp312: ${missing[*]}" >&2
  exit 4
fi
if [ $((bundle + tree)) -gt $((BUDGET_MIB * 1048576)) ]; then
  echo "[fetch] over the ${BUDGET_MIB} MiB that travel: drop --with-flashmla or carry less" >&2
  exit 3
fi
