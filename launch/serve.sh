#!/usr/bin/env bash
# Serve with ESS on 127.0.0.1 (embedded tiny DeepSeek-V3.2 unless --model-path is given).
# usage: bash launch/serve.sh [--ess-config launch/ess_default.yaml] [SGLang / --ess-* flags]
# Environment first: bash launch/setup.sh (CPU) -- a CUDA machine needs torch+sglang installed normally.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
exec "$PY" -m sgl_ess.launch_server "$@"
