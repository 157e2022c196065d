"""Write the simulator's validation report to bench/results/sim_report.json.

  python -m bench sim [--op-profile FILE]     (no GPU; a few seconds)

The same table `python -m sgl_ess.sim validate` prints: the fit (first Table 2 row only) and every
held-out published point with its error, plus the constants with their kinds and sources.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from bench.meta import write_result
from sgl_ess.sim.profile import OpProfile
from sgl_ess.sim.reports import constant_rows
from sgl_ess.sim.validate import checks, fit_summary, worst


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench sim", description=__doc__.split("\n")[0])
    ap.add_argument("--op-profile", default=None, help="op profile to validate (default: h200_published)")
    args = ap.parse_args()
    prof = OpProfile.load(args.op_profile)
    rows = checks(prof)
    payload = {
        "profile": prof.name, "fit": fit_summary(prof),
        "held_out": [dict(asdict(r), error=round(r.error, 2)) for r in rows],
        "worst": {k: dict(asdict(v), error=round(v.error, 2)) for k, v in worst(rows).items()},
        "constants": constant_rows(prof),
    }
    name = "sim_report" if args.op_profile is None else f"sim_report_{prof.name}"
    path = write_result(name, payload)
    for r in rows:
        print(f"{r.point:<58} {r.error_text:>9}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
