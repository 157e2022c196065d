"""Numba exact-LRU resolver for the CPU: one compiled loop over the batch rows, O(k + N) per row.

Runs the order-list algorithm of `sgl_ess.store.lru_list` (the torch path, its reference) phase
for phase like the Triton kernel (`resolver_triton.py`), but sequentially: no atomics and no
barriers, and no per-op dispatch. On the CPU the torch path costs ~90 small torch ops per call
(about 1.2 ms at batch 30, k 32, N 48), which a small model's decode step notices; this is one
call. Same state, bit for bit, as the torch path for every real row; padded rows (req < 0, or
row >= num_real_reqs) get slots -1 / miss / hit False and change no state (the torch path writes
its trash row instead, which nothing reads).

numba is optional (SGLang 0.5.23 pins numba 0.65.1): `available()` says whether it imports; the
first call compiles (cached on disk next to this file, ~2 s the first time).
Memory: the state tensors are updated in place through numpy views (CPU tensors share memory);
each call allocates its outputs and an int32 work area of 3 x k.
"""
from __future__ import annotations

import functools

import numpy as np
import torch


def available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _kernel():
    from numba import njit

    @njit(cache=True, nogil=True)
    def resolve_rows(tokens, reqs, seq_lens, nreal, s2t, order, tmap, slots, miss, hit, ctx):
        b, k = tokens.shape
        n = s2t.shape[1]
        w_slot = np.empty(k, np.int64)     # by last index: hit slot, or -(miss rank + 2), -1
        w_first = np.empty(k, np.int64)    # by last index: first occurrence
        w_vict = np.empty(k, np.int64)     # by miss rank: victim slot
        for i in range(b):
            r = reqs[i]
            if r < 0 or i >= nreal:
                for x in range(k):
                    slots[i, x] = -1
                    miss[i, x] = False
                    hit[i, x] = False
                continue
            fast = seq_lens[i] <= n
            limit = min(n, ctx) if fast else ctx
            # 1. token_map[t + 1] = 1 + last index of t (ascending: the last write is the max)
            for x in range(k):
                w_slot[x] = -1
                w_first[x] = k
                t = tokens[i, x]
                if 0 <= t < limit:
                    tmap[r, t + 1] = x + 1
            # 2. hits, decided against the start-of-step state
            if fast:
                for x in range(k):
                    t = tokens[i, x]
                    if 0 <= t < limit and tmap[r, t + 1] == x + 1 and s2t[r, t] == t:
                        w_slot[x] = t
            else:
                for j in range(n):
                    t = s2t[r, j]
                    if 0 <= t < ctx:
                        last = tmap[r, t + 1]
                        if last > 0:
                            w_slot[last - 1] = j
            # 3. first occurrence of every token, under its last index
            for x in range(k):
                t = tokens[i, x]
                if 0 <= t < limit:
                    last = tmap[r, t + 1]
                    if w_first[last - 1] == k:
                        w_first[last - 1] = x
            # 4. miss ranks in first-occurrence order; distinct hits h and misses m
            m = 0
            h = 0
            for x in range(k):
                t = tokens[i, x]
                if 0 <= t < limit:
                    last = tmap[r, t + 1]
                    if w_first[last - 1] == x:
                        if w_slot[last - 1] < 0:
                            if not fast:
                                w_slot[last - 1] = -(m + 2)
                            m += 1
                        else:
                            h += 1
            # 5. walk the order list: unpinned slots -> the first m are victims, the rest are
            #    compacted to the front (written at an index <= the one just read: in place)
            m_vict = 0 if fast else m
            n_free = 0
            for j in range(n):
                o = order[r, j]
                t = o if fast else s2t[r, o]
                pin = 0 <= t < ctx and tmap[r, t + 1] > 0
                if not pin:
                    if n_free < m_vict:
                        w_vict[n_free] = o
                    else:
                        order[r, n_free - m_vict] = o
                    n_free += 1
            # 6. outputs, the misses' tokens, the order tail (hits, then misses, by last index)
            hc = 0
            mc = 0
            for x in range(k):
                t = tokens[i, x]
                if not 0 <= t < limit:
                    slots[i, x] = -1
                    miss[i, x] = False
                    hit[i, x] = False
                    continue
                last = tmap[r, t + 1]
                v = w_slot[last - 1]
                found = v >= 0
                if fast:
                    slot = t
                elif found:
                    slot = v
                else:
                    slot = w_vict[-v - 2]
                first = w_first[last - 1] == x
                slots[i, x] = slot
                miss[i, x] = first and not found
                hit[i, x] = first and found
                if first and not found:
                    s2t[r, slot] = t
                if last == x + 1:
                    if found:
                        order[r, n - h - m + hc] = slot
                        hc += 1
                    else:
                        order[r, n - m + mc] = slot
                        mc += 1
            # 7. leave the scratch map all zero
            for x in range(k):
                t = tokens[i, x]
                if 0 <= t < limit:
                    tmap[r, t + 1] = 0

    return resolve_rows


def compile_numba() -> None:
    """Compile (or load from the disk cache) the kernel now, on a one-row problem."""
    z = torch.zeros((2, 4), dtype=torch.int64)
    resolve_numba(z.clone(), torch.arange(4, dtype=torch.int32).repeat(2, 1), torch.zeros((2, 9), dtype=torch.int32),
                  torch.tensor([0]), torch.tensor([8]), torch.tensor([[1, 5]]))


def resolve_numba(slot_to_token: torch.Tensor, lru_order: torch.Tensor, token_map: torch.Tensor,
                  reqs: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
                  num_real_reqs: torch.Tensor | None = None):
    """One layer's resolve for a batch, updating the state in place (CPU tensors only).

    slot_to_token int64 [R', N] and lru_order int32 [R', N] (R' > every real req; contiguous),
    token_map int32 [R', CTX + 1] all zero (left all zero; token t at column t + 1), reqs int64 [b]
    (-1 = padded row), seq_lens int64 [b], tokens int [b, k] (-1 padding; positions >= CTX are
    padding), num_real_reqs optional int [1] (rows >= it are padding).
    Returns (slots int64 [b, k] local slot or -1, miss bool [b, k], hit bool [b, k])."""
    for name, t in (("slot_to_token", slot_to_token), ("lru_order", lru_order), ("token_map", token_map)):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"resolve_numba: {name} must be a contiguous CPU tensor (got {t.device}, "
                             f"strides {t.stride()}); use backend='triton' on CUDA")
    if lru_order.dtype != torch.int32 or token_map.dtype != torch.int32 or slot_to_token.dtype != torch.int64:
        raise ValueError(f"resolve_numba: expected slot_to_token int64, lru_order int32, token_map int32; "
                         f"got {slot_to_token.dtype}, {lru_order.dtype}, {token_map.dtype}")
    b, k = tokens.shape
    slots = torch.empty((b, k), dtype=torch.int64)
    miss = torch.empty((b, k), dtype=torch.bool)
    hit = torch.empty((b, k), dtype=torch.bool)
    if b == 0 or k == 0:
        return slots, miss, hit
    nreal = b if num_real_reqs is None else int(num_real_reqs.reshape(()))
    _kernel()(tokens.to(torch.int64).contiguous().numpy(), reqs.to(torch.int64).contiguous().numpy(),
              seq_lens.to(torch.int64).contiguous().numpy(), nreal, slot_to_token.numpy(),
              lru_order.numpy(), token_map.numpy(), slots.numpy(), miss.numpy(), hit.numpy(),
              token_map.shape[1] - 1)
    return slots, miss, hit
