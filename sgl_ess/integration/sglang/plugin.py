"""Entry point of the ``sglang.srt.plugins`` group (declared in pyproject.toml).

SGLang 0.5.23 calls ``sglang.srt.plugins.load_plugins()`` in the launcher, the engine, every
scheduler process and the detokenizer; it runs each plugin's function, then
``HookRegistry.apply_hooks()``. So everything here is registered once per process and takes
effect before any model is built. ``SGLANG_PLUGINS`` (comma list) can exclude this plugin.

SGLang loads the entry point into every SGLang process of the environment, whatever started it. Only a
process of ``python -m sgl_ess.launch_server`` registers anything: the launcher exports its validated
config (``SGLESS_CONFIG``, sgl_ess.config) before SGLang starts its processes, and they inherit it.
Anywhere else (a plain ``python -m sglang.launch_server``) ``load_plugin`` returns at once and
SGLang runs untouched.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys

from sgl_ess.config import ENV_CONFIG_JSON   # no torch, no sglang

logger = logging.getLogger(__name__)
_loaded = False


def ess_process() -> bool:
    """True in the processes of ``python -m sgl_ess.launch_server`` (its config is in the environment)."""
    return bool(os.environ.get(ENV_CONFIG_JSON))


def load_plugin() -> None:
    global _loaded
    if _loaded or not ess_process():
        return
    _loaded = True
    # diagnostics: `kill -USR2 <pid>` writes every thread's Python stack of that SGLang process to
    # its log (stderr) and lets it run on; SGLang itself uses no SIGUSR2
    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sgl_ess.config import config_from_env

    from . import dsv4, targets
    from .backends import backend_registration, cpu_fixes, cuda_backend, eagle, eagle_cpu_kernels
    from .backends.indexer_torch import indexer_forward_native
    from .launcher import compat, dummy_init
    from .observe import slo_hooks
    from .pools import host_pool_class, lifecycle, pd_layout, pd_warmup
    from .routes import runtime_config

    cpu_fixes.register()
    dsv4.register()                # DeepSeek-V4 on CPU (no CUDA only)
    HookRegistry.register(targets.INDEXER_FORWARD_NATIVE, indexer_forward_native, HookType.REPLACE)
    backend_registration.register()
    eagle.register()
    compat.register()
    eagle_cpu_kernels.register()
    lifecycle.register()
    pd_warmup.register()
    pd_layout.register()
    eagle.register_status()   # after lifecycle's internal-state hook
    runtime_config.register()
    host_pool_class.register()
    cuda_backend.register()        # CUDA processes with ESS on only
    dummy_init.register()
    cfg = config_from_env()
    if cfg is not None and cfg.slo_tpot_ms > 0:
        slo_hooks.register()        # only with a TPOT target: otherwise SGLang's scheduling is untouched
    logger.info("sgl-ess plugin loaded (ess attention backend, torch DSA indexer, lifecycle hooks)")
