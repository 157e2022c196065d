"""Vectorised exact-LRU resolver: top-k token positions -> hot-buffer slots + misses.

For one layer and a batch of request rows, `assign` looks every top-k position up in that
request's hot buffer, picks slots for the misses (empty slots first, then the least recently
used non-hit slots), updates the LRU state, and returns where every entry lives. It matches the
per-request `collections.OrderedDict` LRU of `sgl_ess.core.lru_oracle.LruOracle` (hits decided
against the start-of-step state, then misses inserted): same hits, misses, resident set and
recency order.

Whole-batch torch ops only: no Python loop over requests or tokens, no host sync.
Requires N >= k + 1 (checked by StoreConfig), so no entry touched in a step is evicted in it.
Requests whose context fits in N (`seq_lens <= N`) use slot = token position: never evicting.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer

_BIG = torch.iinfo(torch.int64).max


@dataclass
class Assignment:
    """Result of one layer's lookup for b requests and k entries (all on the buffer's device).

    slots:    int64 [b, k] slot within the request's N slots (-1 where the entry was padding)
    miss:     bool  [b, k] the entry must be fetched into `slots` (first occurrence only)
    hit:      bool  [b, k] the entry was already resident (first occurrence only)
    """

    slots: torch.Tensor
    miss: torch.Tensor
    hit: torch.Tensor


def assign(buf: DeviceHotBuffer, layer: int, rows: torch.Tensor, seq_lens: torch.Tensor,
           tokens: torch.Tensor) -> Assignment:
    """rows int64 [b] (unique), seq_lens int64 [b], tokens int64 [b, k] (-1 padded)."""
    b, k = tokens.shape
    n = buf.slots_per_request
    dev = buf.device
    valid = tokens >= 0
    ar_k = torch.arange(k, device=dev).expand(b, k)

    # first occurrence of each distinct token in its row (duplicates share its slot)
    sorted_tok, perm = torch.sort(tokens, dim=1, stable=True)
    new_group = torch.ones_like(sorted_tok, dtype=torch.bool)
    new_group[:, 1:] = sorted_tok[:, 1:] != sorted_tok[:, :-1]
    grp_start = torch.where(new_group, ar_k, torch.zeros_like(ar_k)).cummax(dim=1).values
    first_of_sorted = perm.gather(1, grp_start)
    first_idx = torch.empty_like(perm).scatter_(1, perm, first_of_sorted)
    is_first = first_idx == ar_k

    s2t = buf.slot_to_token[layer].index_select(0, rows)         # [b, n]
    stamp = buf.stamps[layer].index_select(0, rows)              # [b, n]

    # lookup: binary search in each row's sorted resident tokens
    res_sorted, res_order = torch.sort(s2t, dim=1)
    safe_tok = tokens.clamp(min=0).contiguous()
    pos = torch.searchsorted(res_sorted, safe_tok).clamp(max=n - 1)
    found = valid & (res_sorted.gather(1, pos) == tokens)
    hit_slot = res_order.gather(1, pos)

    miss = valid & ~found & is_first
    hit = found & is_first

    # victims: empty slots (stamp -1) first, then oldest; slots hit this step never chosen
    hit_target = torch.where(hit, hit_slot, torch.full_like(hit_slot, n))
    pinned = torch.zeros((b, n + 1), dtype=torch.bool, device=dev).scatter_(1, hit_target, True)[:, :n]
    victim_order = torch.sort(torch.where(pinned, torch.full_like(stamp, _BIG), stamp), dim=1,
                              stable=True).indices
    rank = (torch.cumsum(miss.to(torch.int64), dim=1) - 1).clamp(min=0).clamp(max=n - 1)
    lru_slot = victim_order.gather(1, rank)
    fast = (seq_lens <= n).unsqueeze(1)                           # context fits: slot = position
    miss_slot = torch.where(fast, safe_tok.clamp(max=n - 1), lru_slot)

    slot_first = torch.where(found, hit_slot, miss_slot)
    slots = slot_first.gather(1, first_idx)                        # duplicates -> first's slot
    slots = torch.where(valid, slots, torch.full_like(slots, -1))

    # update LRU state: misses take their slots; every touched slot gets stamp = last touch
    target = torch.where(miss, miss_slot, torch.full_like(miss_slot, n))
    s2t_ext = torch.cat([s2t, s2t.new_full((b, 1), -1)], dim=1).scatter_(1, target, tokens)
    # recency: this step's hits by last occurrence, then its misses by last occurrence
    base = buf.tick(layer, 2 * k)
    touch = torch.where(valid, slots, torch.full_like(slots, n))
    when = ar_k + base + k * (valid & ~found).to(torch.int64)
    stamp_ext = torch.cat([stamp, stamp.new_full((b, 1), -1)], dim=1)
    stamp_ext.scatter_reduce_(1, touch, when, reduce="amax")
    buf.slot_to_token[layer].index_copy_(0, rows, s2t_ext[:, :n])
    buf.stamps[layer].index_copy_(0, rows, stamp_ext[:, :n])
    return Assignment(slots=slots, miss=miss, hit=hit)
