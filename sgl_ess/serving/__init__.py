"""Serving safety policy for ``python -m sgl_ess.launch_server``: pure Python, no torch, no sglang.

Module map:
  exit_codes.py     the launcher's exit codes (one table; a supervisor can tell a bad flag from a crash)
  ops_config.py     ``--guard-*`` / ``--metrics-*`` flags: request limits and operator settings (one table)
  request_rules.py  checks a request body before SGLang sees it: 400s naming the field and the allowed range
  admission.py      does a request fit the host pool at all (prompt + max_new_tokens + one page)?
  preflight.py      checks before the model loads: host-pool sizing, hot-slot feasibility, the bytes
                    --ess-lock-host-memory locks vs RLIMIT_MEMLOCK, the HTTP port
  memory_report.py  "where every byte went": the startup table of host and device memory
  sanitize.py       strips server paths and tracebacks from error messages sent to clients

The SGLang wiring of each lives in ``sgl_ess/integration/sglang/`` (request_guard.py, tokenizer.py,
crash_handler.py, scheduler_probe.py, metrics_exporter.py, health.py).
"""
