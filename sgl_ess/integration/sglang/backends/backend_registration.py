"""Registers the ``ess`` attention backend with SGLang (official seams only), and builds the
one ESS store adapter of each model runner (shared by every backend SGLang builds for it: the
``ess`` backend on CPU, the ESS subclass of ``dsa`` on CUDA, TBO children, draft backends)."""

from __future__ import annotations

import logging

from sgl_ess.config import EssConfig, config_from_env

from ..pools import lifecycle
from .. import targets

logger = logging.getLogger(__name__)


def store_for_runner(runner):
    """The runner's EssPoolAdapter (built on first use), or None with ESS off."""
    from ..pools.pool_adapter import EssPoolAdapter

    cfg = config_from_env() or EssConfig()
    if not cfg.enabled:
        return None
    store = lifecycle.adapter_for(runner)     # one store per model runner, owned by it
    if store is None:
        store = EssPoolAdapter(runner, cfg)
        lifecycle.register_adapter(store)
    return store


def create_ess_backend(runner):
    from .ess_backend import EssSparseAttnBackend

    if str(runner.device).startswith("cuda"):
        raise NotImplementedError(
            "--attention-backend ess is the CPU (torch) path; on CUDA use SGLang's 'dsa' backend, which sgl-ess "
            "extends with ESS when it is on (python -m sgl_ess.launch_server picks it for you)")
    store = store_for_runner(runner)
    logger.info("ess attention backend: ESS %s", "on" if store is not None else "off")
    return EssSparseAttnBackend(runner, store)


def register() -> None:
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import register_attention_backend

    if targets.ESS_BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([targets.ESS_BACKEND_NAME])
    register_attention_backend(targets.ESS_BACKEND_NAME)(create_ess_backend)
