"""LRU warmup: the state exact LRU would reach after touching the prefill's last W top-k sets.

Touching `topk_ids[0]`, then `topk_ids[1]`, ... (oldest query position first, each row left
to right) leaves the N most recently touched distinct tokens resident, ordered by their last
touch. We compute that end state directly (one scatter + one top-k) instead of replaying W
steps, so the first decode step starts warm with one bulk fetch. Runs once per request, so a
host sync here is acceptable.
"""
from __future__ import annotations

import torch


def warm_set(topk_ids: torch.Tensor, seq_len: int, capacity_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids int [W, k] (-1 padded, values < seq_len) ->
    (tokens int64 [m], last_touch int64 [m]) of the m <= capacity most recent distinct tokens,
    oldest first."""
    flat = topk_ids.reshape(-1).to(torch.int64)
    order = torch.arange(flat.numel(), device=flat.device)
    keep = flat >= 0
    last = torch.full((seq_len,), -1, dtype=torch.int64, device=flat.device)
    last.scatter_reduce_(0, flat[keep], order[keep], reduce="amax")
    tokens = torch.nonzero(last >= 0).reshape(-1)
    touch = last[tokens]
    if tokens.numel() > capacity_slots:
        touch, idx = torch.topk(touch, capacity_slots)
        tokens = tokens[idx]
    touch, idx = torch.sort(touch)
    return tokens[idx], touch
