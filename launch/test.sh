#!/usr/bin/env bash
# Set up the CPU environment if needed (launch/setup.sh), then run the whole test suite:
# unit tests, integration tests against real SGLang on CPU, and GPU tests (skipped without CUDA).
# usage: bash launch/test.sh [pytest args]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
bash "$ROOT/launch/setup.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest -q -rs "$@"
