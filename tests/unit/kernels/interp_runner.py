"""Run checks in a child Python with TRITON_INTERPRET=1 (Triton reads it at import, so it
cannot be switched on inside the pytest process). The child prints one line per check:
`CHECK <name> OK` or `CHECK <name> FAIL <message>`."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def run_checks(module: str, timeout_s: int = 900) -> dict[str, str]:
    """Returns {check name: "OK" or the failure message}; raises if the child itself failed."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", module], env=env, capture_output=True, text=True,
                       timeout=timeout_s, cwd=ROOT)
    results = {}
    for line in r.stdout.splitlines():
        if line.startswith("CHECK "):
            _, name, verdict = line.split(" ", 2)
            results[name] = verdict
    if r.returncode != 0 or not results:
        raise RuntimeError(f"{module} exited {r.returncode}\nstdout tail:\n{r.stdout[-2000:]}\n"
                           f"stderr tail:\n{r.stderr[-3000:]}")
    return results


def report(name: str, fn) -> None:
    """Child side: run one check and print its verdict line."""
    try:
        fn()
        print(f"CHECK {name} OK", flush=True)
    except Exception as e:  # noqa: BLE001 - every failure is reported to the parent test
        msg = f"{type(e).__name__}: {e}".replace("\n", " | ")
        print(f"CHECK {name} FAIL {msg[:1500]}", flush=True)
