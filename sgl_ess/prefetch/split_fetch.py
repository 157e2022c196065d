"""SplitFetch: the ranks of an attention-TP group each fetch 1/tp of a step's misses from host memory and
exchange them (issue 17, an option: ``--ess-tp-split-fetch``; measured by ``python -m bench tp_split``).

Why: MLA's latent rows are the same on every attention-TP rank, and so is every rank's plan (the ranks
run the same batches in lockstep: the same top-k, the same LRU state, the same ring rows). Without the
split every rank reads every miss from host memory: TP 8 reads each missed row 8 times over the host
link. With it, rank r reads the plan entries i with i % tp == r, and the group all-gathers what each
read (on a GPU that is NVLink, beside PCIe), so each rank's host reads drop to 1/tp of the misses.

How: a FetchEngine around the store's own engine. Immediate host -> slot plans (a step's misses) are
split at ``submit`` (the other ranks' entries set to -1: static shapes); at ``wait`` - where the step
needs its rows - this rank's rows are gathered from the slot space into a buffer of ceil(M / tp) rows,
the group's collective all-gathers the buffers, and the other ranks' rows are scattered to the same
slot rows (and, for engines that check ring tags, tagged with the plan's sequence number). Every other
plan (warmups, commits, zeroing, speculative staging) passes through unchanged. Every rank waits for
every immediate plan in the same order (the store's lifecycle does: plan, then land), so the
collectives match; a plan never waited for is never exchanged and its rows are never read.

Memory: a [ceil(M / tp), row_bytes] send buffer and the [tp, ceil(M / tp), row_bytes] gathered rows per
exchange (short-lived); borrows the inner engine's StoreMemory.
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
                 all_gather: Callable[[torch.Tensor], torch.Tensor]):
        """`all_gather(t [n, B] uint8) -> [size, n, B]`: the group's collective (the same on every rank)."""
        if not 0 <= rank < size or size < 2:
            raise ValueError(f"SplitFetch: rank {rank} of {size}: expected 0 <= rank < size and size >= 2")
        super().__init__(inner.mem, inner.backend)
        self.inner, self.rank, self.size, self.all_gather = inner, rank, size, all_gather
        self.name = inner.name
        self.ordered_on_device = inner.ordered_on_device
        self.synchronous = inner.synchronous
        self._pending: dict[int, CopyPlan] = {}
        self.exchanges = 0
        self.rows_own = 0 if not inner.ordered_on_device else None      # counted on host engines only
        self.rows_received = 0 if not inner.ordered_on_device else None

    def __getattr__(self, name):            # the inner engine's own attributes (rt, worker state, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def submit(self, plan: CopyPlan) -> Ticket:
        if plan.kind != "h2s" or plan.tier != "immediate":
            return self.inner.submit(plan)
        mine = self._mine(plan.dst_idx.numel(), plan.dst_idx.device)
        sub = dataclasses.replace(plan, src_idx=torch.where(mine, plan.src_idx, -1),
                                  dst_idx=torch.where(mine, plan.dst_idx, -1))
        ticket = self.inner.submit(sub)
        plan.plan_id = sub.plan_id
        self._pending[ticket.plan_id] = plan
        return ticket

    def wait(self, ticket: Ticket) -> None:
        self.inner.wait(ticket)
        plan = self._pending.pop(ticket.plan_id, None)
        if plan is not None:
            self._exchange(plan)

    def done(self, ticket: Ticket) -> bool:
        return ticket.plan_id not in self._pending and self.inner.done(ticket)

    def complete(self, ticket: Ticket) -> None:
        self.inner.complete(ticket)           # zero plans only: they pass through unsplit

    def drain(self) -> None:
        self.inner.drain()

    def close(self) -> None:
        self._pending.clear()
        self.inner.close()

    def stats(self) -> dict:
        s = self.inner.stats()
        s["split_fetch"] = {"rank": self.rank, "size": self.size, "exchanges": self.exchanges,
                            "rows_own": self.rows_own, "rows_received": self.rows_received}
        return s

    # --- internals -----------------------------------------------------------------------
    def _mine(self, n: int, device) -> torch.Tensor:
        return torch.arange(n, device=device) % self.size == self.rank

    def _exchange(self, plan: CopyPlan) -> None:
        """This rank's fetched rows to every rank, every other rank's into this rank's slot space."""
        mem, size = self.mem, self.size
        src, dst = plan.src_idx, plan.dst_idx
        n = dst.numel()
        if n == 0:                  # a compacted plan with nothing to move: empty on every rank alike
            return
        per = -(-n // size)
        valid = (src >= 0) & (dst >= 0)
        dst_v = torch.where(valid, dst, -1)
        if per * size != n:
            dst_v = torch.cat([dst_v, dst_v.new_full((per * size - n,), -1)])
        grid = dst_v.view(per, size).t()                # [size, per]: entry i is [i % size, i // size]
        rows = torch.arange(per, device=dst.device)
        send = torch.zeros((per, mem.slots.shape[1]), dtype=mem.slots.dtype, device=mem.slots.device)
        copy_rows(mem.slots, grid[self.rank], send, torch.where(grid[self.rank] >= 0, rows, -1), self.backend)
        got = self.all_gather(send).reshape(size * per, -1)         # [size * per, B]
        others = grid.clone()
        others[self.rank] = -1
        flat = others.reshape(-1)
        at = torch.arange(flat.numel(), device=flat.device)
        copy_rows(got, torch.where(flat >= 0, at, -1), mem.slots, flat, self.backend)
        self.exchanges += 1
        if not self.ordered_on_device:       # host engines: land() checks ring tags (host syncs are fine here)
            self.rows_own += int((grid[self.rank] >= 0).sum())
            self.rows_received += int((flat >= 0).sum())
            if plan.tag_seq >= 0:
                tag_ring_rows(mem, flat, plan.tag_seq)


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
