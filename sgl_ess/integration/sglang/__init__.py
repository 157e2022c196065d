"""The SGLang overlay: the only package in sgl-ess that imports ``sglang``.

Module map:
  plugin.py                ``load_plugin()``: the ``sglang.srt.plugins`` entry point; registers everything below
  targets.py               every SGLang symbol this overlay hooks or plugs into (one table; see patches/README.md)
  cpu_fixes.py             what SGLang needs to run a DSA model without CUDA (capability probe, absorbed MLA)
  indexer_torch.py         exact pure-torch DSA lightning indexer (CPU path of ``Indexer.forward_native``)
  backend_registration.py  registers the ``ess`` attention backend and builds the store in each scheduler
  store_forward.py         the one request lifecycle through the store (extend, mixed, verify, decode), both backends
  ess_backend.py           the ``ess`` sparse-MLA attention backend (CPU torch kernels; ESS off: device pool)
  pool_adapter.py          adapter between SGLang's pools/requests and ``sgl_ess.store.LatentStore``
  lifecycle.py             frees hot buffers / host rows on finish, abort, retract, flush; usage into internal state
  dummy_init.py            unit-variance random weights for the embedded model (``SGLESS_DUMMY_INIT=scaled``), TP-consistent
  pd_warmup.py             PD: the prefill's warm hot-buffer state rides in SGLang's transfer; pd_layout.py: latent layout check at bootstrap
  host_pool_class.py       SGLang's DSA pool class built host-backed: its latent buffers ARE the ESS host rows
  cuda_backend.py          CUDA: SGLang's DSA backend through store_forward (FlashMLA / Triton kernels); run as GPU fakes only
  cuda_memory.py           CUDA: token-pool sizing without device latents; NOT YET RUN
  speculative.py           EAGLE / NextN (MTP) draft backends with ESS
  query_layout.py          where each forward mode's queries sit (verify, draft steps) and the backends' roles
  spec_cpu_kernels.py      torch versions of the sgl-kernel CPU ops SGLang's EAGLE path calls on CPU
  compat.py                launch-time refusal of flag combinations ESS does not serve (names the flag and why)
  runtime_config.py        ``POST /ess/overlap_level``: change the overlap level of a running server
  route_guard.py           outermost ASGI guard: route policy + auth, body limit, drain, operator dirs, redaction
  auth_keys.py             the API keys kept from SGLang; the warmup's internal token; log_redaction.py: log records
  shutdown.py              bounded SIGTERM drain; open requests ended with an error event on shutdown / crash
  request_guard.py         ASGI request guard in front of SGLang's app (400s naming the field and the range)
  tokenizer.py             SGLang's TokenizerManager plus admission after tokenization and the crash handler
  crash_handler.py         one clear line and a distinct exit code when a server process dies
  health.py                ``GET /health`` reflecting ESS state
  status_route.py          ``GET /ess/status``; scheduler_state.py: the read-only scheduler views behind it
  metrics_exporter.py      Prometheus exporter of sgl_ess.obs.metrics; ops_hooks.py: the operations plugin entry point
  scheduler_probe.py       once per scheduler: memory report, scheduler reference for metrics
  launcher_defaults.py     flags the launcher adds and token-pool sizing; process_env.py: environment before start
  server_args.py           ``python -m sgl_ess.launch_server``: ``--ess-*`` flags, defaults, ``/ess/status``
"""
