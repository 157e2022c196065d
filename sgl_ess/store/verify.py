"""Speculative steps on the store: a request's draft tokens resolve as ONE union set per layer,
and rows become visible to the hot buffers only once they are final.

A speculative forward (EAGLE verify, draft extend) of request r has n query tokens at positions
c .. c+n-1, where c = `committed` is the number of leading positions whose rows are final
(prefilled or accepted). The forward writes the rows of its own window (positions >= c) to the
host pool before attention, and query j selects a top-k among positions <= c + j. So every
selected entry is one of:

  committed (pos < c)    resolved against the hot buffer: all n top-k rows of the request form
                         ONE set (hits decided against the start-of-step state, misses fetched
                         once even when several draft tokens select them);
  overflow               committed entries past the hot buffer's capacity N in one step (the
                         union of n top-k sets can exceed N): read straight from the host pool
                         for this step only, never entered into the LRU, so the step stays exact;
  window (pos >= c)      this forward's own rows: read straight from the host pool, never
                         admitted, because rejected draft tokens' rows must never become visible
                         to a later step.

`CommittedRows` admits the rows that became final since a request's last step (the accepted
tokens: positions [frontier, c)) as the most recently used entries, copied from the host pool,
before the step resolves its union. The committed length comes from the engine's own sequence
lengths, never from the predicted tokens, so cache indices and predictions cannot drift apart;
`check_window` rejects a top-k that selects beyond its query's causal bound.

Memory: borrows the store; `CommittedRows` owns one int64 [L, R] tensor (on the store's device).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.store.step_plan import StepPlan


@dataclass
class UnionPlan:
    """One layer's speculative resolution for b requests x n query tokens x k entries.

    step        the hot-buffer part: the request's distinct committed entries that fit, as one
                set in order of first occurrence, planned by `LatentStore.plan` (land before
                reading, commit after)
    read_slots  int32 [b*n, k]  rows of `store.slot_rows` for committed entries that fit, else -1
    host_locs   int64 [b*n, k]  host-pool locations of window and overflow entries, else -1
    window      bool  [b*n, k]  entry is one of this forward's own rows (position >= committed)
    overflow    bool  [b*n, k]  committed entry read from the host because the union exceeded N
    union_col   int64 [b, n*k]  the column of `step` (the union row) each entry reads, -1 for padding,
                                window and overflow entries (maps step.staged back to the entries)
    """

    step: StepPlan
    read_slots: torch.Tensor
    host_locs: torch.Tensor
    window: torch.Tensor
    overflow: torch.Tensor
    union_col: torch.Tensor | None = None


def distinct_ranks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x int64 [b, m] (-1 padding, duplicates allowed) -> (rank int64 [b, m], first bool [b, m]):
    rank[i, j] = how many distinct values of row i first occur before x[i, j]'s value does (-1 for
    padding); first[i, j] = entry j is its value's first occurrence. Whole-batch torch ops."""
    b, m = x.shape
    valid = x >= 0
    if m == 0:
        return torch.full_like(x, -1), torch.zeros_like(x, dtype=torch.bool)
    key = torch.where(valid, x, torch.iinfo(torch.int64).max)
    srt, idx = torch.sort(key, dim=1, stable=True)              # equal values keep index order
    new = torch.ones_like(srt, dtype=torch.bool)
    new[:, 1:] = srt[:, 1:] != srt[:, :-1]
    gid = torch.cumsum(new.to(torch.int64), dim=1) - 1           # group of each sorted element
    first = torch.full((b, m), m, dtype=torch.int64, device=x.device)
    first.scatter_reduce_(1, gid, idx, "amin")                   # group -> its first index
    elem_first = torch.empty_like(idx)
    elem_first.scatter_(1, idx, first.gather(1, gid))            # element -> its value's first index
    is_first = valid & (elem_first == torch.arange(m, device=x.device))
    rank = torch.cumsum(is_first.to(torch.int64), dim=1) - 1     # distinct rank at first occurrences
    return torch.where(valid, rank.gather(1, elem_first.clamp(max=m - 1)), -1), is_first


def first_distinct(x: torch.Tensor, capacity: int) -> torch.Tensor:
    """bool [b, m]: entry j of row i holds one of the first `capacity` distinct values of row i
    (in order of first occurrence)."""
    rank, _ = distinct_ranks(x)
    return (rank >= 0) & (rank < capacity)


def compact_union(x: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The union of each row as a set: (row int64 [b, C] of its first C = min(capacity, m)
    distinct values in first-occurrence order, -1 padded; col int64 [b, m]: the column of
    row that holds entry j, -1 for padding and for values past the capacity)."""
    b, m = x.shape
    c = min(capacity, m)
    rank, is_first = distinct_ranks(x)
    keep = (rank >= 0) & (rank < c)
    row = torch.full((b, c + 1), -1, dtype=x.dtype, device=x.device)       # column c: dump
    row.scatter_(1, torch.where(is_first & keep, rank, c), torch.where(is_first & keep, x, -1))
    return row[:, :c], torch.where(keep, rank, -1)


def check_window(topk: torch.Tensor, committed: torch.Tensor, what: str) -> None:
    """topk [b, n, k]: query j of request i may select positions 0 .. committed[i] + j (host sync)."""
    if topk.dim() != 3 or topk.shape[0] != committed.numel():
        raise ValueError(f"{what}: expected top-k [batch={committed.numel()}, n, k], got {list(topk.shape)}")
    if topk.numel() == 0:
        return
    if int(topk.min()) < -1:
        raise IndexError(f"{what}: position {int(topk.min())} is negative; only -1 (padding) is allowed")
    bound = committed.to(topk.device, torch.int64)[:, None] + torch.arange(topk.shape[1], device=topk.device)
    over = topk.to(torch.int64) > bound[:, :, None]
    if bool(over.any()):
        i, j = (int(v) for v in over.any(dim=2).nonzero()[0])
        raise IndexError(
            f"{what}: request {i}, query token {j} selects position {int(topk[i, j].max())}, but its causal "
            f"bound is {int(bound[i, j])} (committed {int(committed[i])} + {j}): the draft tokens and the cache "
            "indices are out of step")


def plan_union(store, layer: int, reqs: torch.Tensor, committed: torch.Tensor, topk: torch.Tensor,
               req_to_host: torch.Tensor, micro_batch: int = 0, validate: bool = True,
               padded: bool = False) -> UnionPlan:
    """Resolve a speculative forward's top-k (int [b, n, k] positions, -1 padded) for one layer.

    reqs int64 [b] (open), committed int64 [b]; req_to_host int64 [R, C]. Submits the misses'
    fetch (`store.plan`); the caller lands `plan.step` before attention and commits it after.
    `padded`: `reqs` may hold -1 for padded batch rows (a CUDA graph's batch): their top-k is
    ignored (read as -1), so they select, fetch and count nothing."""
    b, n, k = topk.shape
    dev = store.device
    reqs = reqs.to(dev, torch.int64)
    committed = committed.to(dev, torch.int64)
    pos = topk.to(dev, torch.int64)
    if padded:
        pos = torch.where((reqs >= 0)[:, None, None], pos, -1)
    if validate:
        check_window(pos, committed, "speculative top-k")
    c = committed[:, None, None]
    is_committed = (pos >= 0) & (pos < c)
    window = pos >= c
    flat = torch.where(is_committed, pos, -1).reshape(b, n * k)
    row, col = compact_union(flat, store.cfg.hot_slots_per_request)
    step = store.plan(layer, reqs, committed, row, req_to_host, micro_batch=micro_batch, validate=validate,
                      padded=padded)
    fits = col >= 0
    read = torch.where(fits, step.read_slots.to(torch.int64).gather(1, col.clamp(min=0)), -1)
    overflow = (is_committed.reshape(b, n * k) & ~fits).reshape(b * n, k)
    window = window.reshape(b * n, k)
    from_host = overflow | window
    locs = req_to_host.to(dev)[reqs[:, None, None], pos.clamp(min=0)].reshape(b * n, k)
    return UnionPlan(step=step, read_slots=read.to(torch.int32).reshape(b * n, k),
                     host_locs=torch.where(from_host, locs, -1), window=window, overflow=overflow, union_col=col)


def gather_rows(store, plan: UnionPlan, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The bytes every entry of a landed `plan` reads: uint8 [b*n, k, row_bytes] (hot slots and
    ring rows from the slot space, window and overflow entries from the host pool - on CUDA read
    zero-copy by FlashTrans, only those entries: an explicit choice the adapter counts,
    mtp_window_entries / mtp_overflow_entries) and valid bool [b*n, k]. Call after
    `store.land(plan.step)`."""
    from_host = plan.host_locs >= 0
    out = store.slot_rows[plan.read_slots.long().clamp(min=0)]                 # [b*n, k, row_bytes]
    # the window / overflow entries over them, from the host pool: FlashTrans copies only the
    # entries >= 0 (on CUDA zero-copy: only these rows cross PCIe; static shapes, no host sync)
    flat = out.view(-1, out.shape[-1])
    locs = plan.host_locs.reshape(-1)
    dst = torch.where(locs >= 0, torch.arange(locs.numel(), device=locs.device), -1)
    copy_rows(store.host.rows[layer], locs, flat, dst.to(flat.device), store.transfer_backend)
    return out, (plan.read_slots >= 0) | from_host


class CommittedRows:
    """How far each (layer, request)'s final rows have been admitted to its hot buffer.

    frontier int64 [L, R]: positions < frontier are final and were offered to the hot buffer (by
    prefill warmup or admission). `reset` at prefill; `admit` before each speculative step."""

    def __init__(self, num_layers: int, max_requests: int, device):
        self.frontier = torch.zeros((num_layers, max_requests), dtype=torch.int64, device=device)
        self._admitted = torch.zeros((), dtype=torch.int64, device=device)

    @property
    def rows_admitted(self) -> int:
        return int(self._admitted)          # a host read: metrics and tests only

    def reset(self, layer: int, reqs: torch.Tensor, committed: torch.Tensor) -> None:
        self.frontier[layer].index_copy_(0, reqs.to(self.frontier.device, torch.int64),
                                         committed.to(self.frontier.device, torch.int64))

    def admit(self, store, layer: int, reqs: torch.Tensor, committed: torch.Tensor, req_to_host: torch.Tensor,
              max_rows: int, padded: bool = False) -> torch.Tensor:
        """Admit the final rows [frontier, committed) of each request (at most the newest
        `max_rows`) as its most recently used entries, oldest first. Returns rows admitted (int64
        0-d on the device; no host read). `padded`: `reqs` may hold -1 for padded batch rows (a CUDA
        graph's batch): they admit nothing and move no frontier."""
        dev = self.frontier.device
        reqs = reqs.to(dev, torch.int64)
        committed = committed.to(dev, torch.int64)
        idx = reqs.clamp(min=0) if padded else reqs
        start = torch.maximum(self.frontier[layer].index_select(0, idx), committed - max_rows)
        pos = start[:, None] + torch.arange(max_rows, device=dev)
        pos = torch.where(pos < committed[:, None], pos, -1)
        if padded:
            # padding rows add 0 under amax (a frontier is >= 0): row 0's frontier, live or not, stays;
            # their positions reach admit_from_host, which gives a -1 row no slot and changes nothing
            self.frontier[layer].scatter_reduce_(0, idx, torch.where(reqs >= 0, committed, 0), "amax")
        else:
            self.frontier[layer].index_copy_(0, reqs, torch.maximum(self.frontier[layer].index_select(0, reqs),
                                                                     committed))
        m = store.admit_from_host(layer, reqs, committed, pos, req_to_host, padded=padded)
        self._admitted += m
        return m
