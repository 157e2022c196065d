"""GPU memory accounting with ESS on CUDA (NOT YET RUN on a GPU; see cuda_backend.py).

SGLang sizes its token pool from a GPU memory profile: available bytes / bytes per token, where
a DSA model's bytes per token are the latent row (656 B FP8, 1152 B BF16, per layer) plus the
index key (132 B per layer). With ESS the latent rows live in the host pool, so pricing them on
the GPU would cap the host pool at what the GPU could have held - the opposite of the point. This
AROUND hook on ``DefaultPoolConfigurator._compute_cell_size`` drops the latent term when ESS is
on and the model runs on CUDA; the launcher's ``--max-total-tokens`` (the host pool, sized by
``--ess-memory-pool-size-gb`` or from free host memory) then caps the pool, and the device pays
for the index keys of every token plus, allocated after SGLang's pools, the ESS slot space
(hot buffers and staging rings).
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def latent_bytes_per_token(kvc, num_layers: int) -> int:
    from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim

    dim = calculate_mla_kv_cache_dim(model_config=kvc.model_config, kv_cache_dtype=kvc.kv_cache_dtype)
    return int(dim) * int(num_layers) * torch._utils._element_size(kvc.kv_cache_dtype)


def _around_compute_cell_size(original_fn, self, kvc, num_layers, *args, **kwargs):
    cell = original_fn(self, kvc, num_layers, *args, **kwargs)
    if not getattr(kvc, "use_mla_backend", False) or not str(getattr(kvc, "device", "")).startswith("cuda"):
        return cell
    latent = latent_bytes_per_token(kvc, num_layers)
    device_cell = max(cell - latent, 1)
    logger.info("ESS: GPU bytes per token %d -> %d (latent rows live in the host pool)", cell, device_cell)
    return device_cell


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from . import targets

    HookRegistry.register(targets.POOL_CELL_SIZE, _around_compute_cell_size, HookType.AROUND)
