"""``python -m sgl_ess.launch_server``: from the command line to SGLang's launcher.

  server_args.py        ``--ess-*`` flags, help, resolution, the serve call
  sglang_flags.py       the command line read by SGLang's own parser; the argv for SGLang rebuilt from it
  argv_view.py          reading that argv: flag values, the parallel layout, host pools per node
  launcher_defaults.py  flags the launcher adds
  pool_plan.py          host pool per node and per pool, hot buffers per GPU, and where each number came from
  model_config.py       the model's geometry through transformers.AutoConfig (local dir or hub id / HF cache)
  v4_plan.py            DeepSeek-V4: its C4 entries on the host, window and the rest on the device, sized
  node_devices.py       the node planned for: this machine's devices, or --ess-explain-device cuda:N:GiB
  explain.py            --ess-explain: the plan and SGLang's arguments printed, nothing started
  process_env.py        the environment every server process needs (multi-rank CPU binding, gloo)
  compat.py             launch-time refusal of flag combinations ESS does not serve (names the flag and why)
  auth_keys.py          the API keys kept from SGLang; the warmup's internal token
  log_redaction.py      keys removed from log records
  dummy_init.py         unit-variance random weights for the embedded model, TP-consistent
  shutdown.py           bounded SIGTERM drain; open requests ended with an error event
  crash_handler.py      one clear line and a distinct exit code when a server process dies
  shm_files.py          the server's /dev/shm files, found by its processes and removed on every exit path
"""
