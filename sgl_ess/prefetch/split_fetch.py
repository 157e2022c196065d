"""SplitFetch: the ranks of an attention-TP group each fetch 1/tp of a step's misses from host memory and
exchange them (issue 17, an option: ``--ess-tp-split-fetch``; measured by ``python -m bench tp_split``).

Why: MLA's latent rows are the same on every attention-TP rank, and so is every rank's plan (the ranks
run the same batches in lockstep: the same top-k, the same LRU state, the same ring rows). Without the
split every rank reads every miss from host memory: TP 8 reads each missed row 8 times over the host
link. With it, rank r reads the plan entries i with i % tp == r, and the group all-gathers what each
read (on a GPU that is NVLink, beside PCIe), so each rank's host reads drop to 1/tp of the misses.

How: a FetchEngine around the store's own engine. Immediate host -> slot plans (a step's misses) are
split at ``submit``: the plan's valid entries (its misses: a hit's entry is -1) are numbered in order,
j = 0..V-1, and entry j belongs to rank j % tp at exchange row j // tp - every rank computes the same
numbering from the same plan, so nobody needs another rank's counts. Only the misses are exchanged (issue
32: the exchange carried all b * k plan entries, 86 MB per layer at b 64, k 2048, most of them hits):
`cap` exchange rows per rank, static shapes. On host engines cap = ceil(V / tp), V read on the host (they
sync there anyway); on device engines V is not known on the host without a sync, so cap comes from the
store's config: the store a SplitFetch is installed in calls `size_for_store(cfg)` (LatentStore.engine),
which sets cap = ceil(ring rows per group / tp) - the store's own budget for one plan's misses
(StoreConfig.ring_slots_per_group: max(k, b * k / 8) rows by default; the store itself sends the misses
past it straight to their hot slots), so a step exchanges at most that many rows, not b * k (b 64, k 2048:
16384 rows, 10.7 MB at 656 B, instead of 131072). `cap_rows` (constructor) overrides it; unbound and
unset, ceil(M / tp) for a plan of M entries (every miss fits). A miss whose exchange row is >= cap is read
from host memory by every rank itself: exact whatever the cap, no row lost. At ``wait`` - where the
step needs its rows - this rank's rows are gathered from the slot space into a [cap, row_bytes] buffer,
the group's collective all-gathers the buffers, and the other ranks' rows are scattered to the same slot
rows (and, for engines that check ring tags, tagged with the plan's sequence number). Every other plan
(warmups, commits, zeroing, speculative staging) passes through unchanged. Every rank waits for every
immediate plan in the same order (the store's lifecycle does: plan, then land), so the collectives match;
a plan never waited for is never exchanged and its rows are never read. `stats()["split_fetch"]` counts
the rows and bytes each rank received through the collective.

CUDA graphs (``--ess-cuda-graph``): on a device engine a plan's exchange is the same launches for every
batch of a size (cap from the config; numbering by cumsum; gather, all-gather and scatter over static
shapes; no host read), so a captured decode step holds it, the collective included (NCCL's all-gather is
capturable). Its counts are moved per replay by the store's replay hook (`graph_counts`). Checked on CPU
with the graph double (tests/integration/test_cuda_graph_split_fetch_gpu_fake.py); not captured on a GPU.

Memory: a [cap, row_bytes] send buffer and the [tp, cap, row_bytes] gathered rows per exchange
(short-lived); borrows the inner engine's StoreMemory.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.prefetch.engine import FetchEngine, Ticket
from sgl_ess.prefetch.execute import tag_ring_rows
from sgl_ess.prefetch.plan import CopyPlan


class SplitFetch(FetchEngine):
    def __init__(self, inner: FetchEngine, rank: int, size: int,
                 all_gather: Callable[[torch.Tensor], torch.Tensor], cap_rows: int | None = None):
        """`all_gather(t [n, B] uint8) -> [size, n, B]`: the group's collective (the same on every rank).
        `cap_rows`: exchange rows per rank on a device engine (the same on every rank; None: sized by
        `size_for_store`, else room for every plan entry)."""
        if not 0 <= rank < size or size < 2:
            raise ValueError(f"SplitFetch: rank {rank} of {size}: expected 0 <= rank < size and size >= 2")
        if cap_rows is not None and cap_rows < 1:
            raise ValueError(f"SplitFetch: cap_rows={cap_rows}: expected >= 1 (or None: every miss exchanged)")
        self.cap_rows = cap_rows
        super().__init__(inner.mem, inner.backend)
        self.inner, self.rank, self.size, self.all_gather = inner, rank, size, all_gather
        self.name = inner.name
        self.ordered_on_device = inner.ordered_on_device
        self.synchronous = inner.synchronous
        self._pending: dict[int, tuple[CopyPlan, int]] = {}     # plan id -> (the whole plan, its cap)
        self.exchanges = 0
        self.rows_exchanged = 0                  # rows each rank received from the collective (all ranks')
        self.bytes_exchanged = 0
        self.rows_own = 0 if not inner.ordered_on_device else None      # counted on host engines only
        self.rows_received = 0 if not inner.ordered_on_device else None

    def size_for_store(self, cfg) -> None:
        """The store this engine serves (a StoreConfig; LatentStore calls this when the engine is installed).
        A device engine without an explicit `cap_rows` exchanges at most one ring group's rows per plan, split
        over the ranks: the store's budget for a plan's misses, known on every rank without a host sync."""
        if self.cap_rows is None and self.inner.ordered_on_device:
            self.cap_rows = -(-cfg.ring_slots_per_group // self.size)

    def __getattr__(self, name):            # the inner engine's own attributes (rt, worker state, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def submit(self, plan: CopyPlan) -> Ticket:
        if plan.kind != "h2s" or plan.tier != "immediate":
            return self.inner.submit(plan)
        valid = (plan.src_idx >= 0) & (plan.dst_idx >= 0)
        cap = self._cap(valid)
        owner, row = self._numbering(valid)
        mine = valid & (((owner == self.rank) & (row < cap)) | (row >= cap))   # my share, and every overflow
        sub = dataclasses.replace(plan, src_idx=torch.where(mine, plan.src_idx, -1),
                                  dst_idx=torch.where(mine, plan.dst_idx, -1))
        ticket = self.inner.submit(sub)
        plan.plan_id = sub.plan_id
        self._pending[ticket.plan_id] = (plan, cap)
        if not self.inner.ordered_on_device:
            self.rows_own += int(mine.sum())
        return ticket

    def wait(self, ticket: Ticket) -> None:
        self.inner.wait(ticket)
        pending = self._pending.pop(ticket.plan_id, None)
        if pending is not None:
            self._exchange(*pending)

    def done(self, ticket: Ticket) -> bool:
        return ticket.plan_id not in self._pending and self.inner.done(ticket)

    def wait_layer(self, ticket: Ticket, layer: int) -> bool:
        return self.inner.wait_layer(ticket, layer)

    def complete(self, ticket: Ticket) -> None:
        self.inner.complete(ticket)           # zero plans only: they pass through unsplit

    def drain(self) -> None:
        self.inner.drain()

    def close(self) -> None:
        self._pending.clear()
        self.inner.close()

    def graph_counts(self) -> dict:
        """The exchange counts, which a replayed CUDA graph cannot move (no Python runs): the store's replay
        hook adds what the captured step counted (pool_adapter._host_counts / _set_counts)."""
        return {"exchanges": self.exchanges, "rows_exchanged": self.rows_exchanged,
                "bytes_exchanged": self.bytes_exchanged}

    def set_graph_counts(self, counts: dict) -> None:
        self.exchanges, self.rows_exchanged = counts["exchanges"], counts["rows_exchanged"]
        self.bytes_exchanged = counts["bytes_exchanged"]

    def stats(self) -> dict:
        s = self.inner.stats()
        s["split_fetch"] = {"rank": self.rank, "size": self.size, "exchanges": self.exchanges,
                            "rows_own": self.rows_own, "rows_received": self.rows_received,
                            "rows_exchanged": self.rows_exchanged, "bytes_exchanged": self.bytes_exchanged}
        return s

    # --- internals -----------------------------------------------------------------------
    def _cap(self, valid: torch.Tensor) -> int:
        """Exchange rows per rank for a plan (the same on every rank: the plans are the same)."""
        if not self.inner.ordered_on_device:
            return -(-int(valid.sum()) // self.size)          # the misses' count: a host engine syncs anyway
        every = -(-valid.numel() // self.size)
        return every if self.cap_rows is None else min(self.cap_rows, every)

    def _numbering(self, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per plan entry: the rank that exchanges it and its row in that rank's buffer (valid entries
        numbered in order, j -> rank j % size, row j // size; invalid entries get row -1)."""
        j = torch.cumsum(valid.to(torch.int64), 0) - 1
        return j % self.size, torch.where(valid, j // self.size, -1)

    def _exchange(self, plan: CopyPlan, cap: int) -> None:
        """This rank's fetched rows to every rank, every other rank's into this rank's slot space."""
        if cap == 0:                # no miss (host engines know): nothing to exchange, on every rank alike
            return
        mem, size = self.mem, self.size
        valid = (plan.src_idx >= 0) & (plan.dst_idx >= 0)
        owner, row = self._numbering(valid)
        swapped = valid & (row < cap)                           # entries that go through the collective
        send_rows = swapped & (owner == self.rank)
        send = torch.zeros((cap, mem.slots.shape[1]), dtype=mem.slots.dtype, device=mem.slots.device)
        copy_rows(mem.slots, torch.where(send_rows, plan.dst_idx, -1), send, torch.where(send_rows, row, -1),
                  self.backend)
        got = self.all_gather(send).reshape(size * cap, -1)         # [size * cap, B]
        recv = swapped & (owner != self.rank)
        recv_dst = torch.where(recv, plan.dst_idx, -1)
        copy_rows(got, torch.where(recv, owner * cap + row, -1), mem.slots, recv_dst, self.backend)
        self.exchanges += 1
        self.rows_exchanged += size * cap
        self.bytes_exchanged += size * cap * mem.slots.shape[1]
        if not self.ordered_on_device:       # host engines: land() checks ring tags (host syncs are fine here)
            self.rows_received += int(recv.sum())
            if plan.tag_seq >= 0:
                tag_ring_rows(mem, recv_dst, plan.tag_seq)


def torch_all_gather(group=None) -> Callable[[torch.Tensor], torch.Tensor]:
    """SplitFetch's collective over a torch.distributed process group (None: the default group):
    t [n, B] -> [group size, n, B]. NCCL for device tensors, gloo (a list all-gather) on the CPU."""
    import torch.distributed as dist

    size = dist.get_world_size(group)

    def all_gather(t: torch.Tensor) -> torch.Tensor:
        out = t.new_empty((size,) + tuple(t.shape))
        if t.is_cuda:
            dist.all_gather_into_tensor(out, t.contiguous(), group=group)
        else:
            dist.all_gather(list(out.unbind(0)), t.contiguous(), group=group)
        return out
    return all_gather
