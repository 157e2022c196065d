"""Shared builders for the store tests: a small store and synthetic top-k traces."""
from __future__ import annotations

import torch

from sgl_ess.store import LatentStore, RequestTable, StoreConfig


def make_store(*, layers=2, row_bytes=16, host_tokens=20000, n=64, max_requests=8, k=16,
               max_context=8192, engine="inline", speculative="off", **kw):
    cfg = StoreConfig(num_layers=layers, row_bytes=row_bytes, host_capacity_tokens=host_tokens,
                      hot_slots_per_request=n, max_requests=max_requests, topk=k,
                      max_context_tokens=max_context, **kw)
    store = LatentStore(cfg, transfer_backend="torch", engine=engine, speculative=speculative)
    return store, RequestTable(store)


def token_rows(locs_or_positions: torch.Tensor, row_bytes: int, salt: int = 0) -> torch.Tensor:
    """Deterministic, distinct-per-token byte rows so a wrong slot shows up as wrong bytes."""
    p = locs_or_positions.to(torch.int64).reshape(-1, 1)
    j = torch.arange(row_bytes, dtype=torch.int64).reshape(1, -1)
    return ((p * 131 + j * 7 + salt * 29 + (p >> 8) * 3) % 251).to(torch.uint8)


def locality_trace(gen: torch.Generator, seq_len: int, k: int, steps: int, repeat: float,
                   grow: bool = True):
    """Top-k sets where a fraction `repeat` of each step repeats the previous step's set.
    Yields (seq_len, topk int64 [k]) with unique entries, -1 padded when k > context."""
    cur = seq_len
    prev = torch.randperm(cur, generator=gen)[:k]
    for _ in range(steps):
        n_keep = min(int(round(repeat * prev.numel())), prev.numel())
        keep = prev[torch.randperm(prev.numel(), generator=gen)[:n_keep]]
        pool = torch.ones(cur, dtype=torch.bool)
        pool[keep] = False
        fresh_all = torch.nonzero(pool).reshape(-1)
        fresh = fresh_all[torch.randperm(fresh_all.numel(), generator=gen)[:max(0, min(k, cur) - n_keep)]]
        sel = torch.cat([keep, fresh])
        sel = sel[torch.randperm(sel.numel(), generator=gen)]
        out = torch.full((k,), -1, dtype=torch.int64)
        out[:sel.numel()] = sel
        yield cur, out
        prev = sel
        if grow:
            cur += 1
