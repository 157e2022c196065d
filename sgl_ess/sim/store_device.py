"""Device bytes of the ESS store one GPU builds for a planned launch: the sim's own arithmetic for what
sgl_ess.store.StoreConfig.device_allocation counts (the sim imports no torch, so not that class), per tensor:

  slot_rows    hot buffers (request rows x hot slots x layers) + staging rings (2 layer parities x 4
               micro-batches x max(topk, rows x topk / 8) rows) + MTP scratch rows (rows x (draft tokens +
               max(0, draft x topk - hot slots)), pools/device_budget.verify_rows_per_request), whole 64-row
               pages, x the row's bytes
  ring_tags    8 B per staged row
  lru_state    slot -> token int64 + LRU order int32 per (LRU table, request row + the padding row, slot); one
               table per ANCHOR layer: a shared-index model (GLM-5.2, Hunyuan V4: indexer_types "shared") keeps
               one table per group of layers that share a top-k (StoreConfig.layer_anchors, 7884a3b); with MTP
               one per layer again (pools/pool_adapter.store_anchors: --speculative-algorithm drops the groups)
  token_map    int32 per (request row + 1, context token + 1)
  counters     8 B x (2 x layers x rows + 6 x layers)
  engine       the stream engine's zero row + 4 int64 counters
  plan_scratch the Triton plan epilogue's redirect rows (int32 per micro-batch, request row, hot slot + 1)
               + write_slots(padded=True)'s iota (int64 per request row)
Request rows = --max-running-requests per DP-attention worker + SGLang's padding row; the launcher's
defaults are taken for what a plan does not set (ring slots derived, speculative prefetch off, one hot
buffer per row). Indexer keys are SGLang's own index-key buffer, not the store's: they are not here.
"""
from __future__ import annotations

import math

from .config import ModelSpec, SimConfigError

PAGE_ROWS = 64              # StoreConfig's slot space is allocated in whole pages of rows
RING_MICRO_BATCHES = 4      # StoreConfig.ring_micro_batches default (the launcher does not set it)
RESOLVER_TIERS = 3          # prefetch/plan.TIERS: rows moved per tier, counted by the stream engine


def verify_rows_per_request(draft_tokens: int, topk: int, hot_slots: int) -> int:
    """MTP scratch rows per request row (0 without MTP)."""
    if draft_tokens <= 0:
        return 0
    return draft_tokens + max(0, draft_tokens * topk - hot_slots)


def store_device_allocation(*, layers: int, row_bytes: int, topk: int, request_rows: int, hot_slots: int,
                            context_tokens: int, lru_tables: int, draft_tokens: int = 0) -> dict[str, int]:
    """Bytes by tensor, in StoreConfig.device_allocation's order and names; `lru_tables` = anchor layers
    (= layers without shared-index layers)."""
    if not 1 <= lru_tables <= layers:
        raise ValueError(f"lru_tables={lru_tables}: expected 1..layers={layers} (one per anchor layer)")
    r, n = request_rows, hot_slots
    ring_per_group = max(topk, r * topk // 8)
    staged = 2 * RING_MICRO_BATCHES * ring_per_group
    verify = r * verify_rows_per_request(draft_tokens, topk, n)
    rows = -(-(layers * r * n + staged + verify) // PAGE_ROWS) * PAGE_ROWS
    return {"slot_rows": rows * row_bytes, "ring_tags": 8 * staged,
            "lru_state": lru_tables * (r + 1) * n * (8 + 4),
            "token_map": (r + 1) * (context_tokens + 1) * 4,
            "counters": 8 * (2 * layers * r + 6 * layers),
            "group_map": 0, "speculative": 0,
            "engine": row_bytes + 8 * (RESOLVER_TIERS + 1),
            "plan_scratch": 4 * RING_MICRO_BATCHES * r * (n + 1) + 8 * r}


def hot_slots(m: ModelSpec, ratio: float, context: int) -> int:
    """GPU slots per request per attention layer for a sparse-memory ratio (all of the context at 1.0)."""
    return max(m.topk_tokens + 1, math.ceil(ratio * context)) if m.topk_tokens else context


def lru_tables(m: ModelSpec, mtp: int = 1) -> int:
    """LRU slot tables of the store: one per anchor layer (StoreConfig.layer_anchors groups the shared-index
    layers after an anchor onto its table); every attention layer without shared-index layers, and with MTP
    (`mtp` > 1 tokens verified per step: the server's store keeps one LRU per layer under
    --speculative-algorithm, pools/pool_adapter.store_anchors)."""
    layers = m.num_layers * m.attention_sublayers
    if m.index_anchor_layers == 0:
        raise SimConfigError(f"{m.name}: dense MLA (no indexer): no ESS store to size")
    if m.index_anchor_layers < 0 or mtp > 1:
        return layers
    if m.attention_sublayers != 1:
        raise SimConfigError(f"{m.name}: shared-index layers with {m.attention_sublayers} attention layers per decoder "
                             "layer: not modelled")
    return m.anchors


def model_store_allocation(m: ModelSpec, batch: int, ratio: float, context: int, mtp: int = 1,
                           row_bytes: int | None = None) -> dict[str, int]:
    """The target model's store on one GPU (or DP-attention worker) serving `batch` requests: request rows =
    batch + SGLang's padding row, layers = the model's attention layers, `mtp` tokens verified per step (the
    EAGLE draft-token count; 1 = no MTP), rows of `row_bytes` (default: the model's FP8 device row)."""
    return store_device_allocation(layers=m.num_layers * m.attention_sublayers,
                                   row_bytes=m.latent_bytes_per_token_layer if row_bytes is None else row_bytes,
                                   topk=m.topk_tokens, request_rows=batch + 1, hot_slots=hot_slots(m, ratio, context),
                                   context_tokens=context, lru_tables=lru_tables(m, mtp),
                                   draft_tokens=mtp if mtp > 1 else 0)
