"""Triton plan epilogue: everything `LatentStore.plan` does after the resolver, in one launch.

The reference is `sgl_ess.store.step_plan.plan_epilogue_torch` (the whole-batch torch ops the CPU
path runs); this kernel leaves the same outputs and counters, entry for entry. One program per
batch row (request), the row's k top-k entries in one block:

  1 the misses of the rows before it (a loop over their miss masks) give the row's first ring rank;
    each miss takes the next rank: the first `ring_cap` misses of the batch, in batch order, land
    in the ring group's rows, the rest straight in their hot slot (step_plan.miss_destinations)
  2 each miss writes 1 + its destination under its LRU slot in the row's scratch line; after a
    CTA barrier every entry reads its slot's line: a slot filled by a miss this step is read from
    that miss's row and waits for the fetch (step_plan.read_locations); after a second barrier
    the line is cleared (the scratch is all zero between calls)
  3 outputs per entry: read row, staged, hot_dst, ring_dst, host_src, fetch_dst (-1 where none)
  4 the row's hits and misses are added to the store's counters (atomics: obs/counters.py)

Memory: nothing is allocated; the scratch `redirect` int32 [rows, N + 1] is the store's, zero
between calls. Shapes are static and nothing is read back to the host, so a CUDA graph can hold it.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _plan_epilogue_kernel(slots_ptr, miss_ptr, hit_ptr, tok_ptr, req_ptr, grp_ptr, r2h_ptr, r2h_stride,
                          red_ptr, read_out, staged_out, hot_out, ring_out, src_out, fetch_out,
                          hits_ptr, misses_ptr, layer_cnt_ptr,
                          hot_base, ring_first, ring_cap, MAX_B: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    i = tl.program_id(0)
    idx = tl.arange(0, BLOCK_K)
    inb = idx < K
    carry = tl.zeros((), dtype=tl.int64)
    for j in range(0, MAX_B):                               # 1: misses of the rows before this one
        mj = tl.load(miss_ptr + j * K + idx, mask=inb & (j < i), other=0)
        carry += tl.sum(mj.to(tl.int64), axis=0)
    row = i.to(tl.int64) * K
    slot = tl.load(slots_ptr + row + idx, mask=inb, other=-1).to(tl.int64)
    mis = tl.load(miss_ptr + row + idx, mask=inb, other=0) != 0
    hit = tl.load(hit_ptr + row + idx, mask=inb, other=0) != 0
    g = tl.load(grp_ptr + i).to(tl.int64)
    hot_abs = tl.where(slot >= 0, hot_base + g * N + slot, -1)
    rank = carry + tl.cumsum(mis.to(tl.int64), axis=0) - 1
    ring = mis & (rank < ring_cap)
    dst = tl.where(ring, ring_first + rank, tl.where(mis, hot_abs, -1))
    red = red_ptr + i.to(tl.int64) * (N + 1)                # 2: redirect by slot
    keyed = inb & mis & (slot >= 0)
    tl.store(red + tl.maximum(slot, 0), (dst + 1).to(tl.int32), mask=keyed)
    tl.debug_barrier()
    via = tl.load(red + tl.where(slot >= 0, slot, N), mask=inb, other=0).to(tl.int64) - 1
    tl.debug_barrier()
    tl.store(red + tl.maximum(slot, 0), tl.zeros_like(slot).to(tl.int32), mask=keyed)
    read = tl.where(slot >= 0, tl.where(via >= 0, via, hot_abs), -1)
    staged = (slot >= 0) & (via >= 0)
    tok = tl.load(tok_ptr + row + idx, mask=inb, other=0).to(tl.int64)   # 3: outputs
    r = tl.load(req_ptr + i).to(tl.int64)
    loc = tl.load(r2h_ptr + r * r2h_stride + tl.maximum(tok, 0), mask=inb & mis, other=-1)
    tl.store(read_out + row + idx, read.to(tl.int32), mask=inb)
    tl.store(staged_out + row + idx, staged.to(tl.int8), mask=inb)
    tl.store(hot_out + row + idx, tl.where(mis, hot_abs, -1), mask=inb)
    tl.store(ring_out + row + idx, tl.where(ring, dst, -1), mask=inb)
    tl.store(src_out + row + idx, tl.where(mis, loc, -1), mask=inb)
    tl.store(fetch_out + row + idx, tl.where(mis, dst, -1), mask=inb)
    n_hit = tl.sum(hit.to(tl.int64), axis=0)                 # 4: counters
    n_miss = tl.sum(mis.to(tl.int64), axis=0)
    gc = tl.maximum(g, 0)                                    # a padded row (-1) adds 0, inside the row
    tl.atomic_add(hits_ptr + gc, n_hit)
    tl.atomic_add(misses_ptr + gc, n_miss)
    tl.atomic_add(layer_cnt_ptr, n_hit)                      # layer_hits[layer]
    tl.atomic_add(layer_cnt_ptr + 1, n_miss)                 # layer_misses[layer]
    tl.atomic_add(layer_cnt_ptr + 2, n_miss)                 # rows_h2d[layer]


def plan_epilogue_triton(slots, miss, hit, tokens, reqs, groups, req_to_host, redirect, *, hot_base: int,
                         n_slots: int, ring_first: int, ring_cap: int, hits_row, misses_row, layer_counts):
    """Same arguments and results as step_plan.plan_epilogue_torch, except the counters: `hits_row` /
    `misses_row` int64 [max_requests] (this layer's row of Counters.hits / .misses) and
    `layer_counts` int64 [3] (this layer's hits, misses, rows_h2d; contiguous). `redirect` int32
    [>= b, n_slots + 1], all zero (left zero)."""
    b, k = slots.shape
    dev = slots.device
    read = torch.empty((b, k), dtype=torch.int32, device=dev)
    staged = torch.empty((b, k), dtype=torch.int8, device=dev)
    hot_dst, ring_dst, host_src, fetch_dst = (torch.empty(b * k, dtype=torch.int64, device=dev) for _ in range(4))
    if b == 0:
        return read, staged.bool(), hot_dst, ring_dst, host_src, fetch_dst
    if redirect.shape[0] < b or redirect.shape[1] != n_slots + 1 or redirect.dtype != torch.int32:
        raise ValueError(f"plan epilogue scratch: expected int32 [>= {b}, {n_slots + 1}], got "
                         f"{redirect.dtype}{list(redirect.shape)}")
    # written in place by the kernel at ptr + i (a copy would lose the writes): strided views are refused
    for name, t in (("redirect", redirect), ("hits_row", hits_row), ("misses_row", misses_row),
                    ("layer_counts", layer_counts)):
        if not t.is_contiguous():
            raise ValueError(f"plan_epilogue_triton: {name} must be contiguous (got strides {t.stride()})")
    r2h = req_to_host if req_to_host.stride(1) == 1 else req_to_host.contiguous()
    _plan_epilogue_kernel[(b,)](
        slots.contiguous(), miss.contiguous().view(torch.uint8), hit.contiguous().view(torch.uint8),
        tokens.contiguous(), reqs.contiguous(), groups.contiguous(), r2h, r2h.stride(0), redirect,
        read, staged, hot_dst, ring_dst, host_src, fetch_dst, hits_row, misses_row, layer_counts,
        hot_base, ring_first, ring_cap, MAX_B=triton.next_power_of_2(b), K=k, N=n_slots, BLOCK_K=triton.next_power_of_2(max(k, 2)))
    return read, staged.view(torch.bool), hot_dst, ring_dst, host_src, fetch_dst
