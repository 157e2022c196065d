"""Write the simulator's calibration/prediction table to bench/results/sim_report.json.

Run: python bench/sim_report.py   (no GPU; a few seconds)
"""
from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy  # noqa: E402

from sgl_ess.sim.calibrate import calibration_table, section3_overlap_check, stored_fit  # noqa: E402


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    out = {"command": "python bench/sim_report.py", "git_commit": _commit(),
           "versions": {"python": platform.python_version(), "numpy": numpy.__version__},
           "tuned_constants": vars(stored_fit()), "calibration_and_predictions": calibration_table(),
           "section3_overlap_us": section3_overlap_check()}
    path = ROOT / "bench" / "results" / "sim_report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
