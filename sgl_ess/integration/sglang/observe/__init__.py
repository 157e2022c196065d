"""What the server reports about itself.

  scheduler_probe.py   once per scheduler: the memory report, the scheduler reference for metrics
  scheduler_state.py   the read-only scheduler views behind ``/ess/status`` and metrics
  metrics_exporter.py  Prometheus exporter of sgl_ess.obs.metrics
  slo_hooks.py         ``--ess-slo-tpot-ms``: the scheduler admits up to the SLO controller's cap
"""
