"""launch/setup.sh on a machine with an NVIDIA GPU installs nothing and exits 2 with the GPU install;
with the developer override it builds the CPU environment, and a failed pip step stops it loudly.

The GPU is forced with SGLESS_SETUP_FORCE_GPU=1 (the script's own switch for this test). The failing-pip
case puts a stand-in ``python3`` first on PATH: its ``-m venv`` makes a venv whose ``python`` records its
arguments and fails the ``-r requirements-cpu.txt`` install the way pip does (its message, a conflict
note, exit 1), so no network or install happens."""

from __future__ import annotations

import os
import stat
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(REPO, "launch", "setup.sh")


def _run(venv: str, env: dict, path_prefix: str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("SGLESS_SETUP_")}
    e.update(env)
    if path_prefix:
        e["PATH"] = path_prefix + os.pathsep + e["PATH"]
    return subprocess.run(["bash", SETUP, venv], env=e, capture_output=True, text=True, timeout=120)


def test_refuses_on_a_gpu_machine_and_installs_nothing(tmp_path):
    venv = str(tmp_path / "venv")
    r = _run(venv, {"SGLESS_SETUP_FORCE_GPU": "1"})
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    err = r.stderr
    assert "NVIDIA GPU" in err and "Nothing was installed" in err
    assert 'pip install "sglang==0.5.23"' in err
    assert f"pip install {REPO}\n" in err or f'pip install "{REPO}"' in err
    assert "--ess-explain" in err and "SGLESS_SETUP_CPU_ON_GPU_BOX=1" in err
    assert not os.path.exists(venv)                       # no venv created, nothing copied


def _stand_in_python3(bin_dir, log):
    """A ``python3`` whose ``-m venv DIR`` makes DIR/bin/python: it logs its arguments, prints a
    site-packages path for the sysconfig query, and fails the requirements-cpu install like pip."""
    os.makedirs(bin_dir)
    venv_python = f"""#!/bin/bash
echo "$*" >> {log}
case "$*" in
  *"-r "*requirements-cpu.txt*)
    echo "ERROR: Could not find a version that satisfies the requirement triton==3.4.0"
    echo "sglang 0.5.23 requires anthropic>=0.20.0, which is not installed."
    exit 1;;
  *sysconfig*) echo "$(dirname "$0")/../site";;
esac
exit 0
"""
    py3 = f"""#!/bin/bash
if [ "$1 $2" = "-m venv" ]; then
  mkdir -p "$3/bin"
  cat > "$3/bin/python" <<'PY'
{venv_python}PY
  chmod +x "$3/bin/python"
  exit 0
fi
echo "unexpected python3 call: $*" >&2
exit 99
"""
    path = os.path.join(bin_dir, "python3")
    with open(path, "w") as fh:
        fh.write(py3)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def test_the_override_builds_the_cpu_env_and_a_failed_pip_step_stops_it(tmp_path):
    venv, log = str(tmp_path / "venv"), str(tmp_path / "calls.log")
    _stand_in_python3(str(tmp_path / "bin"), log)
    r = _run(venv, {"SGLESS_SETUP_FORCE_GPU": "1", "SGLESS_SETUP_CPU_ON_GPU_BOX": "1"}, str(tmp_path / "bin"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, (r.returncode, out)
    assert "refused" not in out                                   # the override got past the GPU check
    assert "Could not find a version that satisfies the requirement triton==3.4.0" in out   # pip's own message
    assert "sglang 0.5.23 requires" not in out                    # the expected conflict notes stay quiet
    assert "failed: pip install -r launch/requirements-cpu.txt" in out
    with open(log) as fh:
        calls = fh.read().splitlines()
    assert any("install torch==2.13.0" in c for c in calls), calls
    assert any("--no-deps sglang==0.5.23" in c for c in calls), calls
    assert not any("-e " in c for c in calls), calls              # nothing after the failed step ran
    assert not os.path.exists(os.path.join(venv, "site", "sgl_kernel"))   # no stand-in copied
    assert not any(n.startswith(".sgl_ess_setup") for n in os.listdir(venv))
