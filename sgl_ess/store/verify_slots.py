"""An MTP forward's union as ONE slot table over the slot space, for a sparse attention kernel that
reads rows by slot (SGLang's FlashMLA decode / sparse kernel, our Triton decode): no [b*n, k, row]
copy of the selected rows.

`store/verify.py` resolves the union: committed entries that fit the hot buffer read hot slots or
ring rows (`UnionPlan.read_slots`); the rest are read from the host pool. Here those are given slots
too, in the slot space's MTP scratch rows (SlotSpace.verify_base, V rows per request row r from
verify_base + r*V; StoreConfig.verify_rows_per_request):

  window    this forward's own rows (positions committed .. committed + n - 1): row j of the
            request's scratch holds position committed + j; all n are copied every layer (static
            shape), each once, straight from the host pool (FlashTrans: only these rows cross PCIe)
  overflow  committed entries past the hot buffer (distinct rank >= N in the union): rank N + i
            goes to scratch row n + i, copied once at its first occurrence; only when the
            union can exceed N (n x k > N), else no rows and no work

The scratch rows are rewritten by the next layer's forward: a kernel reads them before the next
copy on the same stream. They never enter the LRU, so rejected draft tokens' rows stay invisible to
later steps, exactly as with the gathered rows. Memory: none of its own (the slot space holds the
scratch); int tensors of the step's shape.
"""
from __future__ import annotations

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.store.verify import UnionPlan, distinct_ranks


def scratch_rows_needed(n: int, topk: int, hot_slots: int) -> int:
    """Scratch rows per request row that a forward of n query tokens per request needs."""
    return n + max(0, n * topk - hot_slots)


def slot_table(store, plan: UnionPlan, layer: int, reqs: torch.Tensor, committed: torch.Tensor,
               topk: torch.Tensor, req_to_host: torch.Tensor, padded: bool = False) -> torch.Tensor:
    """int32 [b*n, k]: the row of `store.slot_rows` every entry of a landed `plan` reads (-1 for
    padding). topk int [b, n, k] positions as given to `plan_union`; reqs / committed int64 [b].
    Copies the window (and overflow) rows into the request's scratch rows first. Call after
    `store.land(plan.step)`. `padded`: `reqs` may hold -1 for padded batch rows (a CUDA graph's
    batch; `plan` planned with padded=True, so their entries are -1): they copy nothing."""
    b, n, k = topk.shape
    cfg, space = store.cfg, store.slots
    v = cfg.verify_rows_per_request
    need = scratch_rows_needed(n, k, cfg.hot_slots_per_request)
    if v < need:
        raise RuntimeError(
            f"ESS MTP forward: {n} query tokens per request with top-k {k} and {cfg.hot_slots_per_request} hot "
            f"slots need {need} scratch rows per request in the slot space, the store has {v}: it was sized "
            "for fewer draft tokens (StoreConfig.verify_rows_per_request, from --speculative-num-draft-tokens via "
            "pools/device_budget.verify_rows_per_request); start the server with the draft-token count it runs")
    dev = store.device
    reqs = reqs.to(dev, torch.int64)
    committed = committed.to(dev, torch.int64)
    pos = topk.to(dev, torch.int64)
    r2h = req_to_host.to(dev)
    base = space.verify_base + reqs * v                                           # [b]
    # window: scratch row j <- host row of position committed + j (every request, every j)
    j = torch.arange(n, device=dev)
    win_dst = (base[:, None] + j).reshape(-1)
    win_src = r2h[reqs[:, None], committed[:, None] + j].reshape(-1).to(torch.int64)
    if padded:                     # a padding row's base would point below verify_base (the ring)
        keep = (reqs >= 0)[:, None].expand(b, n).reshape(-1)
        win_dst, win_src = torch.where(keep, win_dst, -1), torch.where(keep, win_src, -1)
    copy_rows(store.host.rows[layer], win_src, space.rows, win_dst, store.transfer_backend)
    slots = plan.read_slots.to(torch.int64).reshape(b, n, k)
    slots = torch.where(plan.window.reshape(b, n, k), base[:, None, None] + (pos - committed[:, None, None]), slots)
    if need > n:
        # overflow: distinct committed entries of rank >= N (first-occurrence order, as compact_union)
        cap = cfg.hot_slots_per_request
        flat = torch.where((pos >= 0) & (pos < committed[:, None, None]), pos, -1).reshape(b, n * k)
        rank, first = distinct_ranks(flat)
        over = rank >= cap
        dst = torch.where(over, base[:, None] + n + (rank - cap), -1)              # [b, n*k]
        src = torch.where(over & first, r2h[reqs[:, None], flat.clamp(min=0)].to(torch.int64), -1)
        copy_rows(store.host.rows[layer], src.reshape(-1), space.rows, torch.where(over & first, dst, -1).reshape(-1),
                  store.transfer_backend)
        slots = torch.where(plan.overflow.reshape(b, n, k), dst.reshape(b, n, k), slots)
    return slots.reshape(b * n, k).to(torch.int32)
