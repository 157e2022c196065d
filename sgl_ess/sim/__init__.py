"""sgl_ess.sim: performance simulator and capacity planner for ESS decode (pure Python + numpy).

No torch and no sglang anywhere in this package. Entry points: `simulate()` (step.py, one operating
point), `plan()` (planner.py), `checks()` (validate.py, the held-out protocol) and the CLI
`python -m sgl_ess.sim` (run / plan / validate / fit / constants / profile / sweep / sensitivity).
Operator times come from an op profile (profile.py); see README.md.
"""
