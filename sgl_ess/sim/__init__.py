"""sgl_ess.sim: performance simulator and capacity planner for ESS decode (pure Python + numpy).

No torch and no sglang anywhere in this package. Entry points: `simulate()` (one operating point),
`plan()` (capacity planning), and the CLI `python -m sgl_ess.sim` (run / plan / sweep / sensitivity).
"""
