"""run_plan: carry out one CopyPlan on StoreMemory. The same function runs in the scheduler
process (inline engine, fallback after a worker fault) and in the prefetch worker process, so
both produce the same bytes.

CPU: torch gather/scatter (sgl_ess.kernels.flashtrans, torch path). CUDA: the same call
dispatches to the Triton FlashTrans kernel (zero-copy over registered host memory).
"""
from __future__ import annotations

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import CopyPlan


def clear_staged(mem: StoreMemory, rows: torch.Tensor) -> None:
    """Zero slot-space `rows` (int64 [m], ring / speculative rows) and untag them (-1)."""
    rows = rows.to(torch.int64)
    if rows.numel() == 0:
        return
    mem.slots[rows.to(mem.slots.device)] = 0
    staged = rows[rows >= mem.ring_base] - mem.ring_base
    if staged.numel():
        mem.ring_tags.index_fill_(0, staged.to(mem.ring_tags.device), -1)


def tag_ring_rows(mem: StoreMemory, dst: torch.Tensor, seq: int) -> None:
    """Tag the ring rows among slot-space rows `dst` (-1 entries and hot slots ignored) with plan `seq`."""
    ring = dst[dst >= mem.ring_base] - mem.ring_base
    if ring.numel():
        mem.ring_tags.index_fill_(0, ring.to(mem.ring_tags.device), seq)


def run_plan(plan: CopyPlan, mem: StoreMemory, backend: str = "auto") -> int:
    """Execute `plan`; returns rows moved (entries with both indices >= 0)."""
    src, dst = plan.src_idx, plan.dst_idx
    if plan.kind == "zero":
        locs = dst[dst >= 0].to(torch.int64)
        if locs.numel():
            mem.host[:, locs.to(mem.host.device)] = 0
        return int(locs.numel())
    if plan.kind == "h2s":
        copy_rows(mem.host[plan.layer], src, mem.slots, dst, backend)
    elif plan.kind == "s2h":
        copy_rows(mem.slots, src, mem.host[plan.layer], dst, backend)
    elif plan.kind in ("s2s", "move"):
        copy_rows(mem.slots, src, mem.slots, dst, backend)
        if plan.kind == "move":
            clear_staged(mem, src[(src >= 0) & (dst >= 0)])
    else:  # pragma: no cover - CopyPlan validates kind
        raise ValueError(plan.kind)
    if plan.tag_seq >= 0 and plan.kind in ("h2s", "s2s", "move"):
        tag_ring_rows(mem, dst, plan.tag_seq)
    return int(((src >= 0) & (dst >= 0)).sum()) if src.numel() else 0
