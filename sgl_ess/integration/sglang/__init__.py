"""The SGLang overlay: the only package in sgl-ess that imports ``sglang``.

Module map:
  plugin.py                ``load_plugin()``: the ``sglang.srt.plugins`` entry point; registers everything below
  targets.py               every SGLang symbol this overlay hooks or plugs into (one table; see patches/README.md)
  cpu_fixes.py             what SGLang needs to run a DSA model without CUDA (capability probe, absorbed MLA)
  indexer_torch.py         exact pure-torch DSA lightning indexer (CPU path of ``Indexer.forward_native``)
  backend_registration.py  registers the ``ess`` attention backend and builds the store in each scheduler
  ess_backend.py           the ``ess`` sparse-MLA attention backend (top-k rows; ESS off: device pool, on: store)
  pool_adapter.py          adapter between SGLang's pools/requests and ``sgl_ess.store.LatentStore``
  lifecycle.py             frees hot buffers / host rows on finish, abort, retract, flush; usage into internal state
  dummy_init.py            unit-variance random weights for the embedded model (``SGLESS_DUMMY_INIT=scaled``)
  server_args.py           ``python -m sgl_ess.launch_server``: ``--ess-*`` flags, defaults, ``/ess/status``
"""
