#!/usr/bin/env bash
# Set up a CPU virtual environment with torch (CPU build), the pinned SGLang 0.5.23 and
# sgl-ess (editable). Idempotent: a finished environment is reused (marker file).
# usage: bash launch/setup.sh [--with-pd] [VENV_DIR]      (default: .venv in the repo root)
#   --with-pd  also the prefill/decode packages: Mooncake's transfer engine (the non-CUDA wheel, TCP) and
#              SGLang's router (smg); they need Debian's libibverbs1 (apt-get install libibverbs1)
# For CPU machines only. On a machine with an NVIDIA GPU (`nvidia-smi -L` succeeds or /dev/nvidia0 exists) it
# installs nothing and exits 2 with the GPU install (the CPU stand-ins it copies would break a CUDA
# environment); SGLESS_SETUP_CPU_ON_GPU_BOX=1 builds the CPU environment there anyway (development).
# SGLESS_SETUP_FORCE_GPU=1 makes it act as on a GPU machine (tests/unit/test_setup_script.py).
# Installer: uv (PyPI's `uv`, put into the venv by pip first) resolves, downloads and installs in parallel; it
# is given this machine's pip configuration (find-links, extra index URLs, constraints: `pip config list`) and
# pip's choice among indexes (the best version anywhere), so it installs what pip would, faster; bytecode is
# compiled at install, as pip does. A step that fails with uv is run again with pip; without uv (it could not
# be installed, or SGLESS_SETUP_INSTALLER=pip) pip does every step.
# Every step's failure stops the script with pip's own message and a non-zero exit status.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PD=0
if [ "${1:-}" = "--with-pd" ]; then PD=1; shift; fi
V=${1:-$ROOT/.venv}
has_nvidia_gpu() {
  [ "${SGLESS_SETUP_FORCE_GPU:-0}" = 1 ] && return 0
  [ -e /dev/nvidia0 ] && return 0
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}
refuse_on_gpu() {
  cat >&2 <<MSG
[setup] refused: this machine has an NVIDIA GPU (nvidia-smi -L or /dev/nvidia0), and launch/setup.sh builds
the CPU development environment: torch's CPU build, SGLang without its CUDA dependencies and CPU stand-ins for
sgl_kernel and torchvision, which would break a CUDA environment. Nothing was installed.
On a GPU machine (NVIDIA driver with CUDA 13.0 support, R580 or newer: torch 2.14.1's PyPI build), install
sgl-ess next to SGLang in your Python environment (Python >= 3.11):
  pip install "sglang==0.5.23"
  pip install "$ROOT"
  python -m sgl_ess.launch_server --model-path deepseek-ai/DeepSeek-V3.2 --tp 8 --ess-explain
(the last one checks the deployment plan and loads no model; drop --ess-explain to serve).
To build the CPU development environment on this machine anyway: SGLESS_SETUP_CPU_ON_GPU_BOX=1 bash launch/setup.sh
MSG
  exit 2
}
MARK="$V/.sgl_ess_setup_v3"   # v2: prometheus_client, psutil, the sgl_ess_ops plugin entry point, shim murmur_hash32_cpu; v3: numba
PD_MARK="$V/.sgl_ess_setup_pd_v1"
# install ARGS: `uv pip install ARGS` into the venv, or pip's when uv is not there or that step failed with uv
UV_OPTS="" PIP="" INSTALLER_READY=0
installer() {
  [ "$INSTALLER_READY" = 1 ] && return 0
  INSTALLER_READY=1
  PIP="$V/bin/python -m pip -q --disable-pip-version-check install"
  if [ "${SGLESS_SETUP_INSTALLER:-uv}" = uv ] && $PIP "uv==0.13.9" >/dev/null 2>&1 \
      && "$V/bin/python" -m uv --version >/dev/null 2>&1; then
    # pip's own configuration (its files and PIP_* variables) as uv options: the sources and constraints pip uses
    local opts
    opts=$("$V/bin/python" -m pip config list 2>/dev/null | "$V/bin/python" -c '
import re, sys
flag = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
        "constraint": "--constraint"}
seen = []
for line in sys.stdin:
    m = re.match(r"^[^.]*[.]([a-z-]+)=(.*)$", line.strip())
    if m and m.group(1) in flag:
        for v in m.group(2).strip(chr(39) + chr(34)).split():
            if (flag[m.group(1)], v) not in seen:
                seen.append((flag[m.group(1)], v))
print(" ".join(f + " " + v for f, v in seen))') || opts=""
    UV_OPTS="--quiet --python $V/bin/python --native-tls --compile-bytecode --index-strategy unsafe-best-match $opts"
    echo "[setup] installer: uv $("$V/bin/python" -m uv --version | cut -d' ' -f2) (pip if a step fails with it)"
  else
    echo "[setup] installer: pip"
  fi
}
install() {
  installer
  if [ -n "$UV_OPTS" ]; then
    "$V/bin/python" -m uv pip install "$@" $UV_OPTS && return 0
    echo "[setup] uv pip install $* failed (its message above); the same with pip" >&2
  fi
  $PIP "$@"
}
pd_packages() {
  if [ "$PD" = 1 ] && [ ! -f "$PD_MARK" ]; then
    echo "[setup] PD packages: mooncake-transfer-engine-non-cuda, smg (router)"
    install "mooncake-transfer-engine-non-cuda==0.3.13.post1" "smg==1.13.0"
    touch "$PD_MARK"
  fi
}
if [ -f "$MARK" ]; then pd_packages; echo "[setup] $V is ready"; exit 0; fi   # built before (on a GPU box: with the override)
if has_nvidia_gpu && [ "${SGLESS_SETUP_CPU_ON_GPU_BOX:-0}" != 1 ]; then refuse_on_gpu; fi
echo "[setup] creating $V (about 3-5 minutes, ~2.5 GB)"
python3 -m venv "$V"
install torch==2.13.0 || install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
echo "[setup] torch done; installing sglang==0.5.23 (no deps) and its CPU runtime deps"
install --no-deps "sglang==0.5.23"
# SGLang came without its dependencies, so pip's resolver ends this step with "sglang 0.5.23 requires X, which is
# not installed" for each CUDA-side package left out on purpose: those lines (and the heading above them when
# nothing else follows it) are dropped, every other line is shown, and pip's exit status decides (pipefail).
quiet_sglang_notes() {
  awk -v heading="pip's dependency resolver does not currently take into account" '
    index($0, heading) { held = $0; next }
    /^sglang 0\.5\.23 requires / { n++; next }
    { if (held != "") { print held; held = "" } print }
    END { if (n) printf "[setup] %d notes of pip about SGLang dependencies not installed on CPU (expected) hidden\n", n }'
}
if ! install -r "$ROOT/launch/requirements-cpu.txt" 2>&1 | quiet_sglang_notes; then
  echo "[setup] failed: pip install -r launch/requirements-cpu.txt (see pip's message above); nothing after it ran" >&2
  exit 1
fi
SP=$("$V/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# CPU stand-ins for what this machine cannot have (see launch/cpu_shims/README.md)
mkdir -p "$SP/sgl_kernel"
cp "$ROOT/launch/cpu_shims/sgl_kernel/__init__.py" "$SP/sgl_kernel/__init__.py"
cp "$ROOT/launch/cpu_shims/tv_cpu_shim.py" "$SP/"
echo "import tv_cpu_shim" > "$SP/zz_tv_cpu_shim.pth"
install --no-deps -e "$ROOT"
"$V/bin/python" -c "import torch, sglang, sgl_ess; print('[setup] torch', torch.__version__, 'sglang', sglang.__version__)"
touch "$MARK"
pd_packages
