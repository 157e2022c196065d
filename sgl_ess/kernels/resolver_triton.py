"""Triton exact-LRU resolver: one program per batch row, O(k + N) work, no host sync.

Runs the order-list algorithm of `sgl_ess.store.lru_list` step for step and leaves the same
state, bit for bit (the torch version is its reference). The token-indexed scratch map
(`token_map[r, t]` = 1 + the last top-k index holding token t, 0 = not selected) is written
with atomics, read back, and cleared to zero before the program ends.

Phases of one program (a CTA barrier between phases: they exchange data through global memory):
  0 init the per-row work area      1 token_map[t] = max(i + 1) over entries i holding t
  2 hits: each resident slot j whose token is selected writes j under its token's last index
    (fast path: each last occurrence checks slot t directly)
  3 first occurrence of each token (atomic min under its last index)
  4 misses in first-occurrence order get ranks 0..m-1 (prefix sums with a carry across blocks)
  5 walk the order list: unpinned slots -> the first m become victims, the rest are compacted
    in place to the front (each block is loaded before any of it is overwritten)
  6 outputs, slot_to_token of the misses, the order tail (hits then misses, by last occurrence)
  7 clear token_map at the selected tokens
Padded rows (req < 0, or row >= num_real_reqs) write slots -1 / miss 0 / hit 0 and touch no state.

Memory (all CUDA, or CPU under TRITON_INTERPRET=1); nothing is allocated but the per-call work
area [b, 3, k] int32, so the launch can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _entries(tok_row, s, slow, fast, CTX, K: tl.constexpr, N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One block of a row's top-k: (index, in-bounds mask, token int64, selectable mask)."""
    idx = s + tl.arange(0, BLOCK_K)
    inb = idx < K
    tok = tl.load(tok_row + idx, mask=inb, other=-1).to(tl.int64)
    ok = inb & (tok >= 0) & (tok < CTX) & (slow | (fast & (tok < N)))
    return idx, inb, tok, ok


@triton.jit
def _resolve_kernel(tok_ptr, req_ptr, len_ptr, nreal_ptr, s2t_ptr, order_ptr, tmap_ptr, work_ptr,
                    slot_out, miss_out, hit_out, CTX, K: tl.constexpr, N: tl.constexpr,
                    HAS_NREAL: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    i = tl.program_id(0)
    r = tl.load(req_ptr + i).to(tl.int64)
    real = r >= 0
    if HAS_NREAL:
        real = real & (i < tl.load(nreal_ptr))
    r = tl.where(real, r, 0)
    seq = tl.load(len_ptr + i)
    fast = real & (seq <= N)                         # padded rows are neither: all state masked
    slow = real & (seq > N)
    tok_row = tok_ptr + i.to(tl.int64) * K
    s2t = s2t_ptr + r * N
    order = order_ptr + r * N
    tmap = tmap_ptr + r * (CTX + 1) + 1              # token t -> column t + 1 (column 0 unused)
    w_slot = work_ptr + i.to(tl.int64) * 3 * K       # by last index: hit slot, or -(miss rank + 2)
    w_first = w_slot + K                             # by last index: first occurrence
    w_vict = w_slot + 2 * K                          # by miss rank: victim slot
    out_row = i.to(tl.int64) * K
    offs_n = tl.arange(0, BLOCK_N)
    zero_k = tl.zeros([BLOCK_K], dtype=tl.int32)

    # 0 + 1: init the work area; token_map[t] = 1 + last index of t
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        tl.store(w_slot + idx, zero_k - 1, mask=inb)
        tl.store(w_first + idx, zero_k + K, mask=inb)
        tl.atomic_max(tmap + tok, idx + 1, mask=ok)
    tl.debug_barrier()
    # 2: hits. Slow rows: every resident slot whose token is selected; fast rows: slot t = token t
    for s in range(0, N, BLOCK_N):
        j = s + offs_n
        t = tl.load(s2t + j, mask=slow & (j < N), other=-1)
        live = slow & (j < N) & (t >= 0) & (t < CTX)
        last = tl.load(tmap + t, mask=live, other=0, cache_modifier=".cg")
        tl.store(w_slot + last - 1, j.to(tl.int32), mask=live & (last > 0))
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        ok = ok & fast
        last = tl.load(tmap + tok, mask=ok, other=0, cache_modifier=".cg")
        held = tl.load(s2t + tok, mask=ok, other=-1)
        tl.store(w_slot + idx, tok.to(tl.int32), mask=ok & (last == idx + 1) & (held == tok))
    tl.debug_barrier()
    # 3: first occurrence of every token, stored under its last index
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        last = tl.load(tmap + tok, mask=ok, other=1, cache_modifier=".cg")
        tl.atomic_min(w_first + last - 1, idx, mask=ok)
    tl.debug_barrier()
    # 4: miss ranks in first-occurrence order; distinct hit (h) and miss (m) counts
    m = tl.sum(zero_k, axis=0)
    h = tl.sum(zero_k, axis=0)
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        last = tl.load(tmap + tok, mask=ok, other=1, cache_modifier=".cg")
        v = tl.load(w_slot + last - 1, mask=ok, other=-1, cache_modifier=".cg")
        first = tl.load(w_first + last - 1, mask=ok, other=-1, cache_modifier=".cg")
        is_first = ok & (first == idx)
        missf = (is_first & (v < 0)).to(tl.int32)   # only the first occurrence writes a rank
        hitf = (is_first & (v >= 0)).to(tl.int32)
        rank = m + tl.cumsum(missf, axis=0) - missf
        tl.store(w_slot + last - 1, -(rank + 2), mask=(missf > 0) & slow)
        m += tl.sum(missf, axis=0)
        h += tl.sum(hitf, axis=0)
    tl.debug_barrier()
    # 5: walk the order list: unpinned slots -> victims (first m), the rest compacted in place
    m_vict = tl.where(fast, 0, m)
    n_free = tl.sum(zero_k, axis=0)
    for s in range(0, N, BLOCK_N):
        j = s + offs_n
        inb = real & (j < N)
        o = tl.load(order + j, mask=inb, other=0).to(tl.int64)
        t = tl.load(s2t + o, mask=inb & slow, other=-1)
        t = tl.where(fast, o, t)                     # fast rows: slot o holds token o if any
        live = inb & (t >= 0) & (t < CTX)
        pin = tl.load(tmap + t, mask=live, other=0, cache_modifier=".cg") > 0
        free = (inb & ~pin).to(tl.int32)
        rank = n_free + tl.cumsum(free, axis=0) - free
        tl.store(w_vict + rank, o.to(tl.int32), mask=(free > 0) & (rank < m_vict))
        tl.debug_barrier()                           # the whole block is read before it is written
        tl.store(order + rank - m_vict, o.to(tl.int32), mask=(free > 0) & (rank >= m_vict))
        n_free += tl.sum(free, axis=0)
    tl.debug_barrier()
    # 6: outputs (every row), the misses' tokens, the order tail (hits, then misses)
    hc = tl.sum(zero_k, axis=0)
    mc = tl.sum(zero_k, axis=0)
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        last = tl.load(tmap + tok, mask=ok, other=1, cache_modifier=".cg")
        v = tl.load(w_slot + last - 1, mask=ok, other=-1, cache_modifier=".cg")
        first = tl.load(w_first + last - 1, mask=ok, other=-1, cache_modifier=".cg")
        found = v >= 0
        vict = tl.load(w_vict + tl.maximum(-v - 2, 0), mask=ok & ~found & slow, other=-1,
                       cache_modifier=".cg")
        slot = tl.where(fast, tok, tl.where(found, v, vict).to(tl.int64))
        slot = tl.where(ok, slot, -1)
        is_first = ok & (first == idx)
        missf = is_first & ~found
        tl.store(slot_out + out_row + idx, slot, mask=inb)
        tl.store(miss_out + out_row + idx, missf.to(tl.int8), mask=inb)
        tl.store(hit_out + out_row + idx, (is_first & found).to(tl.int8), mask=inb)
        tl.store(s2t + slot, tok, mask=missf)
        hl = (ok & (last == idx + 1) & found).to(tl.int32)
        ml = (ok & (last == idx + 1) & ~found).to(tl.int32)
        hpos = N - h - m + hc + tl.cumsum(hl, axis=0) - hl
        mpos = N - m + mc + tl.cumsum(ml, axis=0) - ml
        tl.store(order + hpos, slot.to(tl.int32), mask=hl > 0)
        tl.store(order + mpos, slot.to(tl.int32), mask=ml > 0)
        hc += tl.sum(hl, axis=0)
        mc += tl.sum(ml, axis=0)
    tl.debug_barrier()
    # 7: leave the scratch map all zero
    for s in range(0, K, BLOCK_K):
        idx, inb, tok, ok = _entries(tok_row, s, slow, fast, CTX, K, N, BLOCK_K)
        tl.store(tmap + tok, zero_k, mask=ok)


def resolve_triton(slot_to_token: torch.Tensor, lru_order: torch.Tensor, token_map: torch.Tensor,
                   reqs: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
                   num_real_reqs: torch.Tensor | None = None, block_k: int = 1024,
                   block_n: int = 2048, num_warps: int = 8):
    """One layer's resolve for a batch, updating the state in place.

    slot_to_token int64 [R', N] and lru_order int32 [R', N] (R' > every real req; contiguous),
    token_map int32 [R', CTX + 1] all zero (left all zero; token t at column t + 1), reqs int64 [b] (-1 = padded row),
    seq_lens int64 [b], tokens int32/int64 [b, k] (-1 padding; positions >= CTX are treated as
    padding), num_real_reqs optional int32/int64 [1] (rows >= it are padding). All on one device.
    Returns (slots int64 [b, k] local slot or -1, miss bool [b, k], hit bool [b, k]).
    """
    b, k = tokens.shape
    n = slot_to_token.shape[1]
    dev = tokens.device
    for name, t in (("slot_to_token", slot_to_token), ("lru_order", lru_order), ("token_map", token_map)):
        if not t.is_contiguous():
            raise ValueError(f"resolve_triton: {name} must be contiguous (got strides {t.stride()})")
    if lru_order.dtype != torch.int32 or token_map.dtype != torch.int32 or slot_to_token.dtype != torch.int64:
        raise ValueError(f"resolve_triton: expected slot_to_token int64, lru_order int32, token_map int32; "
                         f"got {slot_to_token.dtype}, {lru_order.dtype}, {token_map.dtype}")
    slots = torch.empty((b, k), dtype=torch.int64, device=dev)
    miss = torch.empty((b, k), dtype=torch.bool, device=dev)
    hit = torch.empty((b, k), dtype=torch.bool, device=dev)
    if b == 0 or k == 0:
        return slots, miss, hit
    work = torch.empty((b, 3, k), dtype=torch.int32, device=dev)
    tokens = tokens.contiguous()
    nreal = num_real_reqs if num_real_reqs is not None else reqs  # placeholder pointer when absent
    _resolve_kernel[(b,)](
        tokens, reqs.contiguous(), seq_lens.contiguous(), nreal, slot_to_token, lru_order, token_map,
        work, slots, miss.view(torch.int8), hit.view(torch.int8), token_map.shape[1] - 1, K=k, N=n,
        HAS_NREAL=num_real_reqs is not None, BLOCK_K=max(16, min(block_k, triton.next_power_of_2(k))),
        BLOCK_N=max(16, min(block_n, triton.next_power_of_2(n))), num_warps=num_warps)
    return slots, miss, hit
