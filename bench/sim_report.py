"""Write the simulator's validation report and capacity plans to bench/results/.

  python -m bench sim [--op-profile FILE]     (no GPU; a few seconds): sim_report.json
  python -m bench sim --plans                 (no GPU; about a minute): sim_plan_<model>_<context>.json + .png

The report is the table `python -m sgl_ess.sim validate` prints: the calibration (DeepSeek's measured
decode deployment) and every held-out public point with its source and error, plus the constants with
their kinds and sources. The plans are `python -m sgl_ess.sim plan` for GLM-5.2 and DeepSeek-V3.2 on
8 x H200 at 32K and 128K (SLO 50 ms, 2 TB host memory per node), each with its plot and the command.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from dataclasses import asdict

from bench.meta import RESULTS, write_result
from sgl_ess.sim.cli import main as sim_main
from sgl_ess.sim.profile import OpProfile
from sgl_ess.sim.reports import constant_rows
from sgl_ess.sim.validate import checks, fit_summary, worst

PLANS = [(model, ctx) for model in ("glm-5.2", "deepseek-v3.2") for ctx in ("32k", "128k")]
PLAN_FLAGS = ["--gpus", "8xH200", "--slo-ms", "50", "--host-gb", "2048"]


def report(op_profile: str | None) -> int:
    prof = OpProfile.load(op_profile)
    rows = checks(prof)
    payload = {
        "profile": prof.name, "fit": fit_summary(prof),
        "held_out": [dict(asdict(r), error=round(r.error, 2), within_goal=r.within_goal) for r in rows],
        "worst": {k: dict(asdict(v), error=round(v.error, 2)) for k, v in worst(rows).items()},
        "constants": constant_rows(prof),
    }
    name = "sim_report" if op_profile is None else f"sim_report_{prof.name}"
    path = write_result(name, payload)
    for r in rows:
        print(f"{r.point:<58} {r.error_text:>9}")
    print(f"wrote {path}")
    return 0


def _sim(argv: list[str]) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = sim_main(argv)
    if rc != 0:
        raise SystemExit(f"python -m sgl_ess.sim {' '.join(argv)} exited {rc}")
    return buf.getvalue()


def plans() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    for model, ctx in PLANS:
        name = f"sim_plan_{model.replace('-', '_').replace('.', '')}_{ctx}"
        png = RESULTS / f"{name}.png"
        argv = ["plan", "--model", model, "--context", ctx] + PLAN_FLAGS
        text = _sim(argv + ["--plot", str(png)])
        data = json.loads(_sim(argv + ["--json"]))
        path = write_result(name, {"command": "python -m sgl_ess.sim " + " ".join(argv + ["--plot", png.name]),
                                   "plot": png.name, "text": text, "plan": data})
        best, base = data["best"], data["baseline"]
        print(f"{model:>14} {ctx:>5}: batch {best['batch']} r={best['ratio']} {best['tokens_per_s_per_node']:.0f} "
              f"tok/s/node vs off {base['tokens_per_s_per_node'] if base else 0:.0f} (gain {data['gain_pct']}%), "
              f"host {data['sizes']['host_pool_gb_per_node']:.0f} GB/node, binding {data['binding']} -> {path.name}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench sim", description=__doc__.split("\n")[0])
    ap.add_argument("--op-profile", default=None, help="op profile to validate (default: h200_published)")
    ap.add_argument("--plans", action="store_true", help="write the capacity plans (+ plots) instead of the report")
    args = ap.parse_args()
    return plans() if args.plans else report(args.op_profile)


if __name__ == "__main__":
    sys.exit(main())
