"""The SGLang overlay: the only package in sgl-ess that imports ``sglang``.

Five rooms, one concern each, and three files at the top:

  plugin.py       ``load_plugin()``: the ``sglang.srt.plugins`` entry point; registers the rooms' hooks
  ops_hooks.py    the operations entry point (``sgl_ess_ops``): guard, metrics, crash side, in every process
  targets.py      every SGLang symbol this overlay hooks or plugs into (one table; see patches/README.md)

  backends/   attention: the ``ess`` backend (CPU) and the CUDA subclass of SGLang's DSA backend, the
              one request lifecycle both call (store_forward.py), the indexer hand-off, EAGLE / MTP
              draft backends (eagle.py), the CPU stand-ins SGLang needs for DSA and EAGLE
  pools/      memory: SGLang's DSA pool built over the ESS host pool, the adapter to the store,
              hot buffers opened and closed with SGLang's requests (lifecycle.py), TP-shared pools,
              CUDA token-pool sizing, PD transfer layout and warm state
  launcher/   ``python -m sgl_ess.launch_server``: flags, defaults, environment, refusals of flag
              combinations (compat.py), API keys, the embedded model's init, shutdown, crash lines
  routes/     what an HTTP request meets: the route guard, the request guard, admission after
              tokenization, ``/health``, ``/ess/status``, ``/ess/overlap_level``
  observe/    metrics exporter, the scheduler views behind status and metrics, the memory report
              at start, the SLO batch cap

Each room's ``__init__.py`` lists its files. A room imports its own files, ``targets.py`` and the
rooms it needs; nothing in ``sgl_ess`` outside this package imports it except the launcher.
"""
