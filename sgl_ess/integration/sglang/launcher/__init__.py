"""``python -m sgl_ess.launch_server``: from the command line to SGLang's launcher.

  server_args.py        ``--ess-*`` flags, help, resolution, the serve call
  launcher_defaults.py  flags the launcher adds and token-pool sizing
  process_env.py        the environment every server process needs (multi-rank CPU binding, gloo)
  compat.py             launch-time refusal of flag combinations ESS does not serve (names the flag and why)
  auth_keys.py          the API keys kept from SGLang; the warmup's internal token
  log_redaction.py      keys removed from log records
  dummy_init.py         unit-variance random weights for the embedded model, TP-consistent
  shutdown.py           bounded SIGTERM drain; open requests ended with an error event
  crash_handler.py      one clear line and a distinct exit code when a server process dies
"""
