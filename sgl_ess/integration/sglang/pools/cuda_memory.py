"""GPU memory accounting with ESS on CUDA (NOT YET RUN on a GPU; see cuda_backend.py).

SGLang sizes its token pool from a GPU memory profile: available bytes / bytes per token, where
a DSA model's bytes per token are the latent row (656 B FP8, 1152 B BF16, per layer) plus the
index key (132 B per layer). With ESS the latent rows live in the host pool, so pricing them on
the GPU would cap the host pool at what the GPU could have held - the opposite of the point. This
AROUND hook on ``DefaultPoolConfigurator._compute_cell_size`` drops the latent term when ESS is
on and the model runs on CUDA; the launcher's ``--max-total-tokens`` (the host pool, sized by
``--ess-memory-pool-size-gb`` or from free host memory) then caps the pool, and the device pays
for the index keys of every token plus the ESS store: slot space (hot buffers, staging rings,
speculative rows), LRU state, token map, counters. A second AROUND hook, on
``KVCacheConfigurator._profile_available_bytes``, takes that store's bytes
(``StoreConfig.device_allocation``, built by the adapter's own ``store_config`` from the same
flags; the EAGLE draft runner's store too) out of the budget SGLang sizes its pools from, so the
store, allocated after SGLang's pools, is inside SGLang's device-memory budget; a budget too small
for it stops the launch with the flags that fix it.
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


def ess_device_bytes(kvc) -> dict[str, int]:
    """Device bytes of the stores ESS will build on this rank, by runner (from the ESS config, the
    model config and --max-running-requests; before any of them exists)."""
    from sglang.srt.runtime_context import get_schedule, get_spec

    from sgl_ess.config import EssConfig, config_from_env

    from .device_budget import draft_tokens
    from .pool_adapter import speculative_on, store_anchors, store_config

    cfg = config_from_env() or EssConfig()
    mc = kvc.model_config
    row = latent_bytes_per_token(kvc, 1)
    topk = int(mc.hf_config.index_topk)
    # SGLang's request rows per worker: --max-running-requests split over DP-attention workers, plus
    # its padding row 0 (a PD decode node's pre-allocation rows hold no hot buffer: pool_adapter.running_rows)
    per_worker = max(1, int(get_schedule().max_running_requests) // int(getattr(kvc, "attn_dp_size", 1) or 1))
    request_rows = per_worker + 1
    ctx = int(mc.context_len)
    layer_info = getattr(kvc, "layer_info", None)
    layers = int(getattr(layer_info, "num_effective_layers", 0) or mc.num_hidden_layers)
    draft_n = draft_tokens()          # MTP: the stores' scratch rows for the forward's own rows
    # shared-index models: one LRU table per anchor group, as the target's store is built (none with MTP)
    anchors = store_anchors(mc.hf_config, layers, speculative_on())
    out = {"target": sum(store_config(cfg, layers, row, topk, request_rows, ctx, "cuda", 1, draft_tokens=draft_n,
                                      layer_anchors=anchors).device_allocation().values())}
    algo = getattr(get_spec(), "speculative_algorithm", None)
    if algo not in (None, "", "NONE") and getattr(algo, "name", algo) != "NONE":
        draft = int(getattr(getattr(kvc, "spec_aux_config", None), "eagle_draft_num_layers", 0) or
                    getattr(mc.hf_config, "num_nextn_predict_layers", 1) or 1)
        out["draft"] = sum(store_config(cfg, draft, row, topk, request_rows, ctx, "cuda", 1, draft_tokens=draft_n)
                           .device_allocation().values())
    return out


def _around_profile_available_bytes(original_fn, self, pre_model_load_memory, *args, **kwargs):
    avail = original_fn(self, pre_model_load_memory, *args, **kwargs)
    if (not getattr(self, "use_mla_backend", False) or getattr(self, "is_draft_worker", False)
            or not str(getattr(self, "device", "")).startswith("cuda")):
        return avail
    stores = ess_device_bytes(self)
    need = sum(stores.values())
    gib = 1 << 30
    if need >= avail:
        raise ValueError(
            f"ESS: the store's device memory ({need / gib:.2f} GiB: "
            + ", ".join(f"{k} {v / gib:.2f} GiB" for k, v in stores.items())
            + f") does not fit the {avail / gib:.2f} GiB SGLang leaves for its pools: lower "
            "--ess-hot-slots-per-request (or --ess-max-gpu-buffer-size-gb) or --max-running-requests, or raise "
            "--mem-fraction-static")
    logger.info("ESS: %.2f GiB of the %.2f GiB pool budget reserved for the ESS store (%s)", need / gib, avail / gib,
                ", ".join(f"{k} {v} B" for k, v in stores.items()))
    from .device_budget import RESERVED

    RESERVED.update(stores)
    return avail - need


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.POOL_CELL_SIZE, _around_compute_cell_size, HookType.AROUND)
    HookRegistry.register(targets.POOL_BUDGET, _around_profile_available_bytes, HookType.AROUND)
