"""What every benchmark result carries: the command, the commit, versions and the machine."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import subprocess
import sys
import time

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
RESULTS_ENV = "SGL_ESS_BENCH_RESULTS"    # another results folder (bench/gpu_check.sh --dry-run: $OUT/results)


def _git(*args):
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=RESULTS.parent).stdout.strip() or None
    except Exception:
        return None


# the tree as the bench found it, read once when bench starts: a bench that writes several results (plots
# and JSON files) would otherwise find its own first outputs and call the tree dirty
_TREE_AT_START = {"commit": _git("rev-parse", "HEAD"), "dirty": bool(_git("status", "--porcelain"))}


def run_metadata() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    versions = {"python": platform.python_version()}
    for dist in ("sgl-ess", "torch", "numpy", "sglang", "triton"):
        try:   # package metadata: importing sglang itself would cost ~15 s
            versions[dist.replace("-", "_")] = version(dist)
        except PackageNotFoundError:
            versions[dist.replace("-", "_")] = None
    try:
        import torch
        cuda = torch.cuda.is_available()
    except Exception:
        cuda = False
    return {
        "command": " ".join(["python", *getattr(sys, "orig_argv", sys.argv)[1:]]),
        **_TREE_AT_START,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": versions,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "cuda": cuda},
    }


def write_result(name: str, payload: dict, also_to: str | None = None) -> pathlib.Path:
    """bench/results/NAME.json (or $SGL_ESS_BENCH_RESULTS/NAME.json) with the run's metadata; the
    same text also at `also_to` (a bench's --out, e.g. $OUT on the GPU machine) when given."""
    folder = pathlib.Path(os.environ[RESULTS_ENV]) if os.environ.get(RESULTS_ENV) else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    text = json.dumps({"meta": run_metadata(), **payload}, indent=1, default=float) + "\n"
    path.write_text(text)
    if also_to:
        pathlib.Path(also_to).write_text(text)
    return path
