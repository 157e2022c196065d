"""Write the simulator's calibration/prediction table to bench/results/sim_report.json.

Run: python bench/sim_report.py   (no GPU; a few seconds)
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.meta import write_result  # noqa: E402
from sgl_ess.sim.calibrate import calibration_table, section3_overlap_check, stored_fit  # noqa: E402


def main() -> int:
    path = write_result("sim_report", {
        "tuned_constants": vars(stored_fit()), "calibration_and_predictions": calibration_table(),
        "section3_overlap_us": section3_overlap_check()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
