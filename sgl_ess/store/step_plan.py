"""StepPlan: one layer's decode-step resolution for a (sub-)batch, and how it is built.

Built by `LatentStore.plan` after the indexer picked each request's top-k:
  1. the exact-LRU resolver assigns every entry a hot slot (hits keep theirs, misses evict);
  2. each miss is fetched host -> staging ring (ring group of this layer and micro-batch) with a
     fresh sequence number; misses past the ring's capacity go straight to their hot slot
     (back-pressure by inline placement, never an overwrite of another plan's ring rows);
  3. attention reads every entry where it will be: hits from the hot buffer, misses from their
     ring row (or hot slot); `staged` marks the entries that must wait for the fetch;
  4. after attention, `commit` moves landed ring rows into their LRU hot slots, off the critical
     path (a background plan), so the next step finds them resident.

All tensors live on the store's device; nothing here syncs with the host except the miss count
a worker engine needs to address its runs (CPU).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.prefetch.engine import Ticket


@dataclass
class StepPlan:
    """layer, micro_batch: what was resolved; seq: the fetch's ring-tag sequence number.

    reqs        int64 [b]     request indices
    read_slots  int32 [b, k]  row of each entry in SlotSpace.rows (-1: padding)
    staged      bool  [b, k]  entry is read from a row this plan fetches (wait before reading)
    hot_dst     int64 [M]     hot-slot rows of the misses (for commit)
    ring_dst    int64 [M]     ring rows the misses are fetched into, -1 where a miss went straight
                              to its hot slot or was staged speculatively
    spec_dst    int64 [M]     speculative rows that already held a miss, -1 elsewhere (None: the
                              store has no speculative tier)
    host_src    int64 [M]     host locations of the misses (inline re-fetch on a bad tag)
    ticket      the engine's handle for the fetch (None when nothing had to move)
    """

    layer: int
    micro_batch: int
    seq: int
    reqs: torch.Tensor
    read_slots: torch.Tensor
    staged: torch.Tensor
    hot_dst: torch.Tensor
    ring_dst: torch.Tensor
    host_src: torch.Tensor
    spec_dst: torch.Tensor | None
    ticket: Ticket | None = None
    landed: bool = False
    committed: bool = False

    @property
    def num_fetched(self) -> int:
        return int(self.hot_dst.numel())


def miss_destinations(miss: torch.Tensor, hot_abs: torch.Tensor, ring_first_row: int,
                      ring_capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each miss lands. miss bool [b, k], hot_abs int64 [b, k] (absolute hot-slot rows).

    Returns (dst int64 [b, k]: ring row for the first `ring_capacity` misses in batch order, else
    the hot slot, -1 for non-misses; ring bool [b, k]: the miss landed in the ring)."""
    flat = miss.reshape(-1)
    rank = torch.cumsum(flat.to(torch.int64), 0) - 1
    ring = flat & (rank < ring_capacity)
    dst = torch.where(ring, ring_first_row + rank, torch.where(flat, hot_abs.reshape(-1), -1))
    return dst.view_as(hot_abs), ring.view_as(miss)


def read_locations(slots: torch.Tensor, hot_abs: torch.Tensor, miss: torch.Tensor,
                   miss_dst: torch.Tensor, miss_waits: torch.Tensor, n_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per entry: the row attention reads, and whether it waits for the fetch.

    slots int64 [b, k] local LRU slot (-1 padding); miss_dst int64 [b, k] where each miss is
    read from; miss_waits bool [b, k] that row is still being fetched (False: already landed,
    e.g. staged speculatively). A duplicate entry shares its first occurrence's slot, so the
    redirect is keyed by slot: a slot filled by a miss this step is read from that miss's row."""
    b = slots.shape[0]
    key = torch.where(miss, slots, n_slots)
    redirect = torch.full((b, n_slots + 1), -1, dtype=torch.int64, device=slots.device)
    redirect.scatter_(1, key, torch.where(miss, miss_dst, -1))
    waits = torch.zeros((b, n_slots + 1), dtype=torch.bool, device=slots.device)
    waits.scatter_(1, key, miss if miss_waits is miss else miss & miss_waits)
    lookup = torch.where(slots >= 0, slots, n_slots)
    via = redirect.gather(1, lookup)
    read = torch.where(via >= 0, via, hot_abs)
    read = torch.where(slots >= 0, read, -1)
    return read, waits.gather(1, lookup)


def plan_epilogue_torch(slots, miss, hit, tokens, reqs, groups, req_to_host, counters, layer: int, *, hot_base: int,
                        n_slots: int, ring_first: int, ring_cap: int):
    """Everything `LatentStore.plan` does after the resolver when no speculative staging is claimed:
    hot rows, miss destinations, read locations, the fetch and commit indices, the counters. The
    reference of sgl_ess.kernels.plan_epilogue_triton (one launch on CUDA).

    slots int64 [b, k] local LRU slot (-1 padding); miss / hit bool [b, k]; tokens int64 [b, k];
    reqs / groups int64 [b]; req_to_host int64 [R, C]. Returns (read int32 [b, k], staged bool
    [b, k], hot_dst, ring_dst, host_src, fetch_dst int64 [b*k], -1 where none)."""
    hot_abs = torch.where(slots >= 0, hot_base + groups.unsqueeze(1) * n_slots + slots, -1)
    counters.add_step(layer, groups, hit, miss)
    dst, to_ring = miss_destinations(miss, hot_abs, ring_first, ring_cap)
    read, staged = read_locations(slots, hot_abs, miss, dst, miss, n_slots)
    miss_f, dst_f = miss.reshape(-1), dst.reshape(-1)
    host_src = torch.where(miss_f, req_to_host[reqs.unsqueeze(1), tokens.clamp(min=0)].reshape(-1), -1)
    # miss_destinations' dst is already -1 off the misses, and its ring flags only misses: the fetch
    # destinations are dst itself and the ring rows need no second mask
    return (read.to(torch.int32), staged, torch.where(miss_f, hot_abs.reshape(-1), -1),
            torch.where(to_ring.reshape(-1), dst_f, -1), host_src, dst_f)
