"""StoreConfig: the sizes of the ESS latent store, validated once.

Owns no memory. Every error names the value received, what is allowed, and the
`launch_server` flag / YAML key that sets it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# The paper recommends at least 6.4K GPU slots per request per layer (ESS.md §3).
PAPER_MIN_HOT_SLOTS = 6400
# The slot space is allocated in whole pages of rows (store/slot_space.py).
PAGE_ROWS = 64


class StoreConfigError(ValueError):
    """A store size is out of range; the message names the setting that fixes it."""


@dataclass(frozen=True)
class StoreConfig:
    """Sizes of the host pool and the per-request device hot buffers.

    num_layers:            layers with a latent cache (the model's sparse-attention layers)
    row_bytes:             bytes of one latent row (656 FP8 FlashMLA, 1152 BF16, any for tests)
    host_capacity_tokens:  token rows in the host pool, per layer
    hot_slots_per_request: N, device slots per (request, layer); must be >= topk + 1
    max_requests:          request rows: the engine's request-pool indices a caller may pass
                           (rows of its req_to_host table)
    hot_groups:            hot buffers (0: one per request row). Fewer than max_requests: a request
                           row gets one when it opens and gives it back when it closes, so rows that
                           never run (a PD decode node's pre-allocated, in-transfer rows) cost no
                           device memory; at most hot_groups rows are open at once
    topk:                  k, entries the indexer selects per query token
    max_context_tokens:    longest request (sizes the request -> host-location table)
    device:                where hot buffers live ("cpu", "cuda", "cuda:1")
    pin_host:              page-lock the host pool (None: yes exactly when device is CUDA)
    lock_host:             mlock the host pool and (on CPU) the slot space against swap, in every
                           process that maps them (--ess-lock-host-memory); off by default
    warmup_window:         W, prefill query positions whose top-k warm the LRU
    ring_slots:            staging-ring rows per ring group (0: max_requests x topk / 8, >= topk)
    ring_micro_batches:    sub-batches of one layer that may be in flight at once (DBA halves x
                           Two-Batch-Overlap micro-batches); each gets its own ring group
    spec_slots:            rows per layer parity for speculative prefetch (0 = the tier is off)
    verify_rows_per_request: slot-space rows per request row for an MTP forward's own (window) rows and
                           the union's overflow, read by the sparse kernel as slots (store/verify_slots.py;
                           0 = no MTP; integration/sglang/pools/device_budget.verify_rows_per_request)
    resolver_backend:      "auto" (Triton kernel on CUDA; on the CPU the numba kernel when numba
                           imports, else torch) | "torch" | "triton" | "numba"
    layer_anchors:         shared-index layers (GLM-5.2 indexer_types "shared"): per layer, the layer whose
                           top-k it uses (its anchor: the last layer at or before it with an indexer); ()
                           = every layer its own. A group (an anchor and the layers that follow it) has ONE
                           LRU slot table, resolved once per step at the anchor; rows stay per layer
    """

    num_layers: int
    row_bytes: int
    host_capacity_tokens: int
    hot_slots_per_request: int
    max_requests: int
    topk: int
    max_context_tokens: int = 131072
    device: str = "cpu"
    pin_host: bool | None = None
    lock_host: bool = False
    warmup_window: int = 32
    ring_slots: int = 0
    ring_micro_batches: int = 4
    spec_slots: int = 0
    resolver_backend: str = "auto"
    hot_groups: int = 0
    verify_rows_per_request: int = 0
    layer_anchors: tuple = ()

    def __post_init__(self) -> None:
        _positive("num_layers", self.num_layers, "the model config (num_hidden_layers)")
        _positive("row_bytes", self.row_bytes, "the latent layout (kv_cache_dim x dtype bytes)")
        _positive("host_capacity_tokens", self.host_capacity_tokens,
                  "--ess-memory-pool-size-gb / ess_config.memory_pool_size_gb")
        _positive("max_requests", self.max_requests, "--max-running-requests")
        _positive("topk", self.topk, "the model config (index_topk)")
        _positive("max_context_tokens", self.max_context_tokens, "--context-length")
        if self.warmup_window < 0:
            raise StoreConfigError(
                f"warmup_window={self.warmup_window}: expected >= 0 (0 disables LRU warmup); "
                "set --ess-warmup-queries")
        if (self.ring_slots < 0 or self.ring_micro_batches < 1 or self.spec_slots < 0
                or self.verify_rows_per_request < 0):
            raise StoreConfigError(
                f"ring_slots={self.ring_slots}, ring_micro_batches={self.ring_micro_batches}: expected "
                "ring_slots >= 0 (0 = derive) and ring_micro_batches >= 1; set --ess-ring-slots")
        if not isinstance(self.hot_groups, int) or not 0 <= self.hot_groups <= self.max_requests:
            raise StoreConfigError(
                f"hot_groups={self.hot_groups!r}: expected 0 (one hot buffer per request row) .. max_requests="
                f"{self.max_requests}; it follows --max-running-requests")
        if self.resolver_backend not in ("auto", "torch", "triton", "numba"):
            raise StoreConfigError(f"resolver_backend={self.resolver_backend!r}: expected auto, torch, triton or numba")
        _check_anchors(self.layer_anchors, self.num_layers)
        if self.hot_slots_per_request < self.topk + 1:
            raise StoreConfigError(
                f"hot_slots_per_request={self.hot_slots_per_request} is smaller than topk+1="
                f"{self.topk + 1}: a step's top-k plus the newest token must all be resident. "
                "Raise --ess-hot-slots-per-request (or the sparse memory ratio); the paper recommends >= "
                f"{PAPER_MIN_HOT_SLOTS}")

    @property
    def anchors(self) -> tuple[int, ...]:
        """Each layer's anchor (itself without shared-index layers)."""
        return tuple(self.layer_anchors) or tuple(range(self.num_layers))

    @property
    def slot_tables(self) -> int:
        """LRU slot tables per hot buffer: one per anchor layer (= num_layers without shared layers)."""
        return len(set(self.anchors))

    def table_of(self, layer: int) -> int:
        """The slot table of `layer`: its anchor's ordinal among the anchors."""
        a = self.anchors
        return sorted(set(a)).index(a[layer])

    def group_layers(self, anchor: int) -> list[int]:
        """The layers that use anchor `anchor`'s top-k (the anchor first)."""
        return [i for i, a in enumerate(self.anchors) if a == anchor]

    @property
    def ring_groups(self) -> int:
        """Ring groups: layer parity (a layer's ring is committed while the next layer runs) x
        micro-batches."""
        return 2 * self.ring_micro_batches

    @property
    def groups(self) -> int:
        """Hot buffers the store allocates (G): hot_groups, or one per request row."""
        return self.hot_groups or self.max_requests

    @property
    def ring_slots_per_group(self) -> int:
        if self.ring_slots:
            return self.ring_slots
        return max(self.topk, self.groups * self.topk // 8)

    @property
    def hot_slots_total(self) -> int:
        """Device slots per layer across all hot buffers (G x N)."""
        return self.groups * self.hot_slots_per_request

    @property
    def host_bytes(self) -> int:
        return self.num_layers * self.host_capacity_tokens * self.row_bytes

    @property
    def device_bytes(self) -> int:
        """Hot buffers + staging rings (the latent bytes ESS keeps on the device)."""
        ring = self.ring_groups * self.ring_slots_per_group + 2 * self.spec_slots
        return (self.num_layers * self.hot_slots_total + ring) * self.row_bytes

    def device_allocation(self) -> dict[str, int]:
        """Bytes a store of this config allocates on its device, by tensor: the slot space's rows in
        whole pages (hot buffers, rings, speculative rows), their ring tags, the LRU state of every
        (layer, hot buffer + the padding row), the resolver's token map and the counters. What
        SGLang's GPU budget must leave room for (integration/sglang/pools/cuda_memory.py); with spec
        rows, the speculative stager's counters; and the CUDA stream engine's zero row and row counters
        (prefetch/stream_engine.py); the plan scratch: the Triton plan epilogue's redirect rows (int32
        [micro-batches, max_requests, N + 1]) and write_slots(padded=True)'s 0..max_requests-1 (int64).
        Everything is built at start, so what a step uses later is in it."""
        n_layers, r, n = self.num_layers, self.groups, self.hot_slots_per_request
        staged = self.ring_groups * self.ring_slots_per_group + 2 * self.spec_slots
        verify = self.max_requests * self.verify_rows_per_request     # MTP window / overflow rows (no tags)
        rows = -(-(n_layers * r * n + staged + verify) // PAGE_ROWS) * PAGE_ROWS
        return {"slot_rows": rows * self.row_bytes, "ring_tags": 8 * staged,
                # slot -> token int64, LRU order int32: one table per anchor layer (shared-index layers: none)
                "lru_state": self.slot_tables * (r + 1) * n * (8 + 4),
                "token_map": (r + 1) * (self.max_context_tokens + 1) * 4,
                "counters": 8 * (2 * n_layers * r + 6 * n_layers),
                "group_map": 8 * self.max_requests if self.hot_groups else 0,   # request row -> hot buffer
                # store/speculative.py: rows staged and used per layer, two [2] accuracy counters
                "speculative": 8 * (2 * n_layers + 4) if self.spec_slots else 0,
                # zero row, rows moved per tier (3: prefetch/plan.TIERS), rows zeroed
                "engine": self.row_bytes + 8 * (3 + 1),
                # plan scratch (LatentStore.__init__): redirect int32 [micro-batches, R, N + 1] + iota int64 [R]
                "plan_scratch": 4 * self.ring_micro_batches * self.max_requests * (n + 1) + 8 * self.max_requests}


def hot_slots_for(topk: int, *, context_tokens: int | None = None, ratio: float | None = None,
                  slots: int | None = None, min_slots: int = PAPER_MIN_HOT_SLOTS) -> int:
    """N from an absolute count, or from the sparse-memory ratio r x context (at least
    `min_slots`, never below topk + 1 and never above the context when it is known)."""
    if slots is not None:
        if slots <= 0:
            raise StoreConfigError(f"hot slots={slots}: expected > 0; set --ess-hot-slots-per-request")
        return max(int(slots), topk + 1)
    if ratio is None:
        n = min_slots
    else:
        if not (0.0 < ratio <= 1.0):
            raise StoreConfigError(
                f"sparse memory ratio={ratio}: expected 0 < r <= 1 (the sparse memory ratio: GPU slots / context)")
        if context_tokens is None or context_tokens <= 0:
            raise StoreConfigError("a sparse memory ratio needs the context length; set --context-length")
        n = max(math.ceil(ratio * context_tokens), min_slots)
    if context_tokens:
        n = min(n, context_tokens + 1)
    return max(n, topk + 1)


def _check_anchors(anchors, num_layers: int) -> None:
    """layer_anchors: () or one entry per layer; an anchor is its own anchor and precedes its group,
    groups are contiguous runs of layers."""
    if not anchors:
        return
    a = list(anchors)
    ok = len(a) == num_layers and all(isinstance(x, int) for x in a)
    ok = ok and all(0 <= x <= i and a[x] == x for i, x in enumerate(a))
    ok = ok and all(a[i] == a[i - 1] or a[i] == i for i in range(1, len(a)))
    if not ok:
        raise StoreConfigError(
            f"layer_anchors={a!r}: expected one entry per layer ({num_layers}), each the index of the last layer at "
            "or before it that has an indexer (its own index for such a layer); it follows the model config "
            "(indexer_types / index_topk_freq, SGLang's dsa_layer_skips_topk)")


def _positive(name: str, value: int, fix: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise StoreConfigError(f"{name}={value!r}: expected a positive integer; set it via {fix}")
