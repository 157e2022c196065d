"""Exact-LRU resolver: top-k token positions -> hot-buffer slots + misses.

For one layer and a batch of requests, `assign` looks every top-k position up in that
request's hot buffer, picks slots for the misses (empty slots first, then the least recently
used non-hit slots), updates the LRU state, and returns where every entry lives. It matches the
per-request `collections.OrderedDict` LRU of `sgl_ess.core.lru_oracle.LruOracle` (hits decided
against the start-of-step state, then misses inserted): same hits, misses, resident set and
recency order.

One algorithm (an explicit LRU order list per (layer, request), see `lru_list.py`), three
implementations that leave identical state in `DeviceHotBuffer`, so calls may mix them:
  backend="torch"   whole-batch torch ops (the reference for both kernels; runs anywhere);
  backend="triton"  one Triton launch (`sgl_ess.kernels.resolver_triton`), O(k + N) per request,
                    no host sync, no allocation but its output: CUDA-graph capturable. Needs
                    the buffer built with `max_context_tokens` (its scratch map).
  backend="numba"   the same steps as one compiled CPU loop (`sgl_ess.kernels.resolver_numba`):
                    the CPU default when numba imports (one call instead of ~90 torch ops).
Requires k <= N (StoreConfig enforces N >= k + 1). Requests whose context fits in N
(`seq_lens <= N`) use slot = token position: never evicting.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.lru_list import assign_list_torch

BACKENDS = ("torch", "triton", "numba")


@dataclass
class Assignment:
    """Result of one layer's lookup for b requests and k entries (all on the buffer's device).

    slots:    int64 [b, k] slot within the request's N slots (-1 where the entry was padding,
              or the whole row was a padded batch row)
    miss:     bool  [b, k] the entry must be fetched into `slots` (first occurrence only)
    hit:      bool  [b, k] the entry was already resident (first occurrence only)
    """

    slots: torch.Tensor
    miss: torch.Tensor
    hit: torch.Tensor


def assign(buf: DeviceHotBuffer, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor,
           tokens: torch.Tensor, *, backend: str = "torch",
           num_real_reqs: torch.Tensor | None = None) -> Assignment:
    """reqs int64 [b] (unique; -1 marks a padded batch row), seq_lens int64 [b],
    tokens int32/int64 [b, k] (-1 padded), num_real_reqs optional int32/int64 [1] on the
    buffer's device: batch rows >= it are padding (SGLang's CUDA-graph padded batch, as
    HiSparse's `num_real_reqs`). Padded rows get slots -1 and change no state."""
    if backend not in BACKENDS:
        raise ValueError(f"resolver backend {backend!r}: expected one of {BACKENDS}")
    b, k = tokens.shape
    n = buf.slots_per_request
    if k > n:
        raise ValueError(f"resolve: top-k width {k} exceeds the {n} hot slots per request; raise "
                         "--ess-hot-slots-per-request (StoreConfig.hot_slots_per_request >= topk + 1)")
    if b == 0 or k == 0:
        empty = torch.zeros((b, k), dtype=torch.bool, device=tokens.device)
        return Assignment(torch.full((b, k), -1, dtype=torch.int64, device=tokens.device), empty, empty)
    if backend == "torch":
        slots, miss, hit = assign_list_torch(buf, layer, reqs, seq_lens, tokens.to(torch.int64),
                                             num_real_reqs)
        return Assignment(slots=slots, miss=miss, hit=hit)
    if backend == "numba":
        from sgl_ess.kernels.resolver_numba import resolve_numba
        tmap = buf.token_map_for(seq_lens)
        s2t, order = buf.layer_state[layer]
        slots, miss, hit = resolve_numba(s2t, order, tmap,
                                         reqs, seq_lens, tokens, num_real_reqs)
        return Assignment(slots=slots, miss=miss, hit=hit)
    if buf.max_context_tokens is None:
        raise ValueError("resolver backend 'triton' needs the hot buffer's token map: build "
                         "DeviceHotBuffer(..., max_context_tokens=StoreConfig.max_context_tokens) "
                         "(--context-length), or use backend='torch'")
    from sgl_ess.kernels.resolver_triton import resolve_triton
    s2t, order = buf.layer_state[layer]
    slots, miss, hit = resolve_triton(s2t, order,
                                      buf.token_map, reqs, seq_lens, tokens, num_real_reqs)
    return Assignment(slots=slots, miss=miss, hit=hit)
