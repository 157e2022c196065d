"""DeepSeek-V4 with ESS on, sized before anything loads: what goes to the host, what stays on the device.

V4 has no DSA latent pool, so pool_plan.plan hands it here. The model's config.json (compress_ratios,
window, head dims, index_topk) is read into the simulator's V4Spec (sim/dsv4.spec_from_config), and
every per-token and per-request byte count is the simulator's own arithmetic (host_bytes_per_token,
device_parts, c4_bytes), so `python -m sgl_ess.sim v4` and ``--ess-explain`` cannot disagree.

  host    ESS's host store (integration/sglang/dsv4/c4_store.py): the C4 entries, one per 4 tokens in each
          C4 layer, each in SGLang's V4 FP8 row (584 B, attention/dsv4_kv_rows.py). The store holds one row
          per C4 location of SGLang's KV pool (its locations // 4, per C4 layer: SGLang's own key for an
          entry), so it is sized by --max-total-tokens, as the pool is, and the radix cache shares it.
  device  per request: the 128-token window of every layer (fixed per request), the C128 entries, the
          C4 indexer keys, the compressor states (SGLang's V4 layout, as on a GPU node), and a hot
          buffer of C4 entries per C4 layer (core/hot_slots.py's rule, as dsv4/ess_setup.py applies it).

``store_config`` is the one function that sizes the store, here and in C4EntryStore (the test
tests/integration/test_dsv4_explain.py checks that the two agree). Owns no memory.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from sgl_ess.config import EssConfig
from sgl_ess.serving.preflight import PreflightError

# SGLang's req_to_token row is the context length + 4 tokens without speculative decoding
# (srt/mem_cache/allocation_sizing.get_req_to_token_extra_context_len; ESS on V4 refuses MTP), and the
# C4 store keeps that row's // 4 entries per request (dsv4/c4_store.py, C4_RATIO)
REQ_TO_TOKEN_EXTRA_TOKENS = 4
C4_RATIO = 4
V4_HEAD_DIM, V4_ROPE = 512, 64          # SGLang's KVLayout.V4 (attention/dsv4_kv_rows.py)
V4_PAGE_TOKENS = 256                    # SGLang's V4 page (arg_groups/model_overrides/deepseek_v4.py)


@dataclasses.dataclass(frozen=True)
class V4Model:
    """A DeepseekV4ForCausalLM config as model_config.load_geometry read it: `config` is its text config as
    a dict; `context_len` SGLang's get_context_length of it."""
    config: dict
    context_len: Optional[int] = None


def plan(model: str, v4: V4Model, cfg: EssConfig, running: int, context_given: Optional[int],
         pool_tokens: int, usable_host_bytes: Optional[int] = None) -> dict:
    """The V4 sizing (a JSON-able dict, exported with the rest of the sizing and printed by --ess-explain).
    `running`: --max-running-requests; `context_given`: --context-length; `pool_tokens`: --max-total-tokens
    (the launcher's, as SGLang gets it); `usable_host_bytes`: host memory the store may take
    (serving/host_memory.usable_bytes; None: not known, not checked). Raises PreflightError."""
    from sgl_ess.core.hot_slots import hot_slots_rule
    from sgl_ess.sim.config import SimConfigError
    from sgl_ess.sim.dsv4 import c4_bytes, device_parts, host_bytes_per_token, spec_from_config

    try:
        spec = spec_from_config(v4.config, name=model)
    except SimConfigError as e:
        raise PreflightError(f"--model-path {model}: DeepSeek-V4 with ESS on: {e}") from None
    c4_ids = [i for i, r in enumerate(spec.ratios) if r == 4]
    if not c4_ids:
        raise PreflightError(f"--model-path {model}: DeepSeek-V4 with ESS on, but its compress_ratios have no "
                             "ratio-4 (C4) layer: ESS has nothing to keep in host memory; serve it with "
                             "--ess-enabled false")
    context = context_given or v4.context_len
    if not context:
        raise PreflightError(f"--model-path {model}: its config gives no context length, which sizes the V4 ESS "
                             "host store (entries per request); give --context-length")
    rows = running + 1                                   # SGLang's request rows: row 0 is padding
    entries = max(1, (context + REQ_TO_TOKEN_EXTRA_TOKENS) // C4_RATIO)
    if spec.head_dim != V4_HEAD_DIM:
        raise PreflightError(f"--model-path {model}: DeepSeek-V4 with head_dim {spec.head_dim}; SGLang's V4 KV "
                             f"layout (584-byte FP8 rows: {V4_HEAD_DIM - V4_ROPE} NoPE + {V4_ROPE} RoPE) needs "
                             f"head_dim {V4_HEAD_DIM}")
    row_bytes = spec.entry_bytes                         # SGLang's V4 FP8 row, as the store keeps it
    hot, hot_source = hot_slots_rule(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb, len(c4_ids),
                                     row_bytes, spec.topk_entries, rows)
    if hot < spec.topk_entries + 1:
        raise PreflightError(f"DeepSeek-V4 with ESS: {hot} hot entries per request and C4 layer ({hot_source}); "
                             f"index_topk={spec.topk_entries} needs >= {spec.topk_entries + 1}: raise "
                             "--ess-hot-slots-per-request (or --ess-max-gpu-buffer-size-gb)")
    if not (cfg.hot_slots_per_request or cfg.max_gpu_buffer_size_gb):
        hot_source = f"default {hot_source}; set --ess-hot-slots-per-request to change"
    pool = runner_pool_tokens(pool_tokens)
    store = store_config(len(c4_ids), row_bytes, spec.topk_entries, rows, entries, pool, hot, cfg.warmup_queries)
    alloc = store.device_allocation()
    need = store.host_bytes + sum(alloc.values())          # on the CPU the slot space is host memory too
    if usable_host_bytes is not None and need > usable_host_bytes:
        raise PreflightError(f"DeepSeek-V4's ESS store needs {need / 1e9:.2f} GB of host memory ({pool // C4_RATIO} "
                             f"C4 locations of a {pool}-location KV pool x {len(c4_ids)} C4 layers x {row_bytes} B, "
                             f"and its hot buffers), but {usable_host_bytes / 1e9:.2f} GB is usable (MemAvailable "
                             "minus the safety margin); lower --max-total-tokens")
    device = device_parts(spec, context)
    return {
        "path": model, "layers": len(spec.ratios), "c4_layer_ids": c4_ids, "c128_layers": spec.c128_layers,
        "window_only_layers": len(spec.ratios) - len(c4_ids) - spec.c128_layers,
        "window_tokens": spec.window_tokens, "swa_page_tokens": spec.swa_page_tokens, "head_dim": spec.head_dim,
        "index_topk": spec.topk_entries, "index_head_dim": spec.index_head_dim,
        "context_tokens": context, "context_tokens_source": "--context-length" if context_given else
        "the model's config", "request_rows": rows, "entries_per_request": entries,
        "entry_bytes": row_bytes, "indexer_bytes_per_entry": spec.indexer_bytes_per_entry,
        "host_bytes_per_token": host_bytes_per_token(spec, row_bytes),
        "host_store_bytes": store.host_bytes, "pool_tokens": pool, "c4_locations": pool // C4_RATIO,
        "device_bytes_per_request": device, "device_bytes_per_request_total": sum(device.values()),
        "hot_entries_per_request": hot, "hot_source": hot_source,
        "hot_buffer_bytes_per_request": c4_bytes(spec, hot, row_bytes),
        "store_device_allocation": alloc, "store_device_bytes": sum(alloc.values()),
    }


def store_config(c4_layers: int, row_bytes: int, index_topk: int, request_rows: int, entries_per_request: int,
                 pool_tokens: int, hot_entries: int, warmup_queries: int):
    """The StoreConfig of the C4EntryStore dsv4/ess_setup.py builds (dsv4/c4_store.py builds it with this
    function): one host row per C4 location of the KV pool (pool_tokens // 4) per C4 layer, a hot buffer per
    request row."""
    from sgl_ess.store.config import StoreConfig

    return StoreConfig(num_layers=c4_layers, row_bytes=row_bytes, host_capacity_tokens=pool_tokens // C4_RATIO,
                       hot_slots_per_request=hot_entries, max_requests=request_rows, topk=index_topk,
                       max_context_tokens=entries_per_request, device="cpu", warmup_window=warmup_queries)


def runner_pool_tokens(max_total_tokens: int) -> int:
    """The full KV pool's locations SGLang gives a V4 runner for --max-total-tokens: whole 256-token pages
    plus its padding page 0 (dsv4/ess_setup.pool_tokens reads the same from the allocator)."""
    return max_total_tokens // V4_PAGE_TOKENS * V4_PAGE_TOKENS + V4_PAGE_TOKENS
