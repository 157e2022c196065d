#!/usr/bin/env bash
# Set up a CPU virtual environment with torch (CPU build), the pinned SGLang 0.5.23 and
# sgl-ess (editable). Idempotent: a finished environment is reused (marker file).
# usage: bash launch/setup.sh [--with-pd] [VENV_DIR]      (default: .venv in the repo root)
#   --with-pd  also the prefill/decode packages: Mooncake's transfer engine (the non-CUDA wheel, TCP) and
#              SGLang's router (smg); they need Debian's libibverbs1 (apt-get install libibverbs1)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PD=0
if [ "${1:-}" = "--with-pd" ]; then PD=1; shift; fi
V=${1:-$ROOT/.venv}
MARK="$V/.sgl_ess_setup_v3"   # v2: prometheus_client, psutil, the sgl_ess_ops plugin entry point, shim murmur_hash32_cpu; v3: numba
PD_MARK="$V/.sgl_ess_setup_pd_v1"
pd_packages() {
  if [ "$PD" = 1 ] && [ ! -f "$PD_MARK" ]; then
    echo "[setup] PD packages: mooncake-transfer-engine-non-cuda, smg (router)"
    "$V/bin/python" -m pip -q --disable-pip-version-check install "mooncake-transfer-engine-non-cuda==0.3.13.post1" "smg==1.13.0"
    touch "$PD_MARK"
  fi
}
if [ -f "$MARK" ]; then pd_packages; echo "[setup] $V is ready"; exit 0; fi
echo "[setup] creating $V (about 3-5 minutes, ~2.5 GB)"
python3 -m venv "$V"
PIP="$V/bin/python -m pip -q --disable-pip-version-check"
$PIP install torch==2.13.0 || $PIP install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
echo "[setup] torch done; installing sglang==0.5.23 (no deps) and its CPU runtime deps"
$PIP install --no-deps "sglang==0.5.23"
$PIP install -r "$ROOT/launch/requirements-cpu.txt" 2>&1 | grep -v "sglang 0.5.23 requires" || true
SP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# CPU stand-ins for what this machine cannot have (see launch/cpu_shims/README.md)
mkdir -p "$SP/sgl_kernel"
cp "$ROOT/launch/cpu_shims/sgl_kernel/__init__.py" "$SP/sgl_kernel/__init__.py"
cp "$ROOT/launch/cpu_shims/tv_cpu_shim.py" "$SP/"
echo "import tv_cpu_shim" > "$SP/zz_tv_cpu_shim.pth"
$PIP install --no-deps -e "$ROOT"
"$V/bin/python" -c "import torch, sglang, sgl_ess; print('[setup] torch', torch.__version__, 'sglang', sglang.__version__)"
touch "$MARK"
pd_packages
