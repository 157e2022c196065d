"""Exact LRU over an explicit per-(layer, request) order list: the torch implementation.

The algorithm (the Triton kernel in `sgl_ess.kernels.resolver_triton` runs the same steps and
leaves bit-identical state; `DeviceHotBuffer` documents the state):

  For one request, with top-k tokens t[0..k) (-1 padding; duplicates allowed), slot_to_token
  s2t[N] and order list o[N] (least -> most recently used):
  1. dedup: a token-indexed scratch map gets 1 + each token's last index in t (max); each
     token's first index is found under its last index (min).
  2. lookup: each resident slot looks its token up in the map: selected -> a hit (decided
     against the start-of-step state). The map is cleared again (only the k cells written).
  3. victims: walk o and drop the pinned slots (hit this step); the first m remaining slots
     (m = distinct misses) are the victims, taken by the misses in first-occurrence order.
     Empty slots sit at the front of o, so they go first. N >= k guarantees m victims exist.
  4. new order: the other unpinned slots keep their relative order (a prefix-sum compaction),
     then the hit slots by their token's last occurrence, then the miss slots by their token's
     last occurrence - exactly `LruOracle`'s recency after a step.
  5. s2t[victim] = missed token.
  Fast path (seq_len <= N): slot = token position, never evicting; step 3 drops every touched
  slot (hit or miss) and takes no victims.

Cost per request: O(k + N) gathers, scatters and prefix sums; no sort. Whole-batch torch ops:
no Python loop over requests or tokens, no host sync when the buffer's token map has a fixed
width (`max_context_tokens`); padded rows write only the buffer's trash row.
"""
from __future__ import annotations

import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer


def assign_list_torch(buf: DeviceHotBuffer, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor,
                      tokens: torch.Tensor, num_real_reqs: torch.Tensor | None = None):
    """reqs int64 [b] (unique among real rows; -1 = padded row), seq_lens int64 [b],
    tokens int64 [b, k] (-1 padded), num_real_reqs optional int [1] (rows >= it are padding),
    all on `buf.device`. Returns (slots int64 [b, k], miss bool [b, k], hit bool [b, k])."""
    b, k = tokens.shape
    n = buf.slots_per_request
    tmap = buf.token_map_for(seq_lens)            # [R + 1, C + 1] int32, token t -> column t + 1
    ctx = tmap.shape[1] - 1
    dev = tokens.device
    ar_k = torch.arange(k, device=dev)
    ar_n = torch.arange(n, device=dev).expand(b, n)

    real = reqs >= 0
    if num_real_reqs is not None:
        real = real & (torch.arange(b, device=dev) < num_real_reqs.reshape(()).to(dev))
    row = torch.where(real, reqs, buf.max_requests)                          # padded -> trash row
    s2t = buf.slot_to_token_ext[layer].index_select(0, row)                  # [b, n] (a copy)
    order = buf.lru_order_ext[layer].index_select(0, row).long()             # [b, n] (a copy)
    fast = ((seq_lens <= n) & real).unsqueeze(1)                             # [b, 1]
    limit = torch.where(fast, min(n, ctx), (real * ctx).unsqueeze(1))        # positions < limit
    valid = (tokens >= 0) & (tokens < limit)
    flat_map = tmap.view(-1)
    base = (row * (ctx + 1) + 1).unsqueeze(1)     # flat cell of token 0; cell 0 of a row stays 0

    # 1. dedup through the token map: 1 + last index of each token (invalid entries use the
    #    always-zero cell 0 and write 0 there); the first index is kept under the last index
    at = torch.where(valid, base + tokens, 0).view(-1)
    flat_map.scatter_reduce_(0, at, torch.where(valid, ar_k + 1, 0).to(torch.int32).view(-1), "amax")
    last1 = flat_map.gather(0, at).view(b, k).long()                         # 0 = invalid
    first_of = torch.full((b, k + 1), k, dtype=torch.int64, device=dev)     # column 0: dump
    first_of.scatter_reduce_(1, last1, ar_k.expand(b, k), "amin")
    is_first = valid & (first_of.gather(1, last1) == ar_k)
    is_last = last1 == ar_k + 1

    # 2. lookup against the start-of-step state: each slot's token in the map (an empty slot,
    #    -1, reads cell 0). Fast rows: slot t can only hold token t, so the same lookup works.
    held1 = flat_map.gather(0, (base + s2t).view(-1)).view(b, n)             # 1 + last index
    by_last = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)      # hit slot, column 0: dump
    by_last.scatter_(1, held1.long(), ar_n)
    flat_map.scatter_(0, at, 0)                                              # map all zero again
    found = valid & (by_last.gather(1, last1) >= 0)
    miss = is_first & ~found
    hit = is_first & found
    m = miss.sum(dim=1, keepdim=True)
    h = hit.sum(dim=1, keepdim=True)

    # 3. victims: the first m unpinned slots of the order list. Fast rows take no victims
    #    (slot = position) and drop every touched slot, hit or miss.
    removed = torch.zeros((b, n + 1), dtype=torch.bool, device=dev)
    removed[:, :n] = held1 > 0
    removed.scatter_(1, torch.where(valid & fast, tokens, n), True)
    free = ~removed.gather(1, order)                                          # [b, n] by rank
    ahead = torch.cumsum(free, dim=1) - free.long()                           # free slots before
    m_victims = torch.where(fast, 0, m)
    pos = ahead - m_victims                                                   # < 0: a victim
    victims = torch.zeros((b, k + 1), dtype=torch.int64, device=dev)          # column k: dump
    victims.scatter_(1, torch.where(free & (pos < 0), ahead, k), order)
    miss_rank = torch.cumsum(miss, dim=1) - 1
    slot_first = torch.where(found, by_last.gather(1, last1),
                             victims.gather(1, miss_rank.clamp(min=0)))
    slot_first = torch.where(fast, tokens, slot_first)
    slots = torch.where(valid, slot_first.gather(1, first_of.gather(1, last1).clamp(max=k - 1)), -1)

    # 4. new order, scattered straight into the state (a permutation: every rank written once;
    #    masked lanes and padded rows write the trash row only): kept slots (compacted), then
    #    hits, then misses, each group by last occurrence
    order_flat = buf.lru_order_ext[layer].view(-1)
    row_base = (row * n).unsqueeze(1)
    trash = buf.max_requests * n
    slots32 = slots.clamp(min=0).to(torch.int32)                  # trash cells stay valid slots
    order_flat.scatter_(0, torch.where(free & (pos >= 0), row_base + pos, trash).view(-1),
                        order.to(torch.int32).view(-1))
    hit_last = is_last & found
    miss_last = is_last & ~found
    hit_pos = row_base + (n - 1) - h - m + torch.cumsum(hit_last, dim=1)
    order_flat.scatter_(0, torch.where(hit_last, hit_pos, trash).view(-1), slots32.view(-1))
    miss_pos = row_base + (n - 1) - m + torch.cumsum(miss_last, dim=1)
    order_flat.scatter_(0, torch.where(miss_last, miss_pos, trash).view(-1), slots32.view(-1))

    # 5. misses take their slots (the evicted tokens are overwritten; the trash row gets -1)
    s2t_flat = buf.slot_to_token_ext[layer].view(-1)
    s2t_flat.scatter_(0, torch.where(miss, row_base + slots, trash).view(-1),
                      torch.where(miss, tokens, -1).view(-1))
    return slots, miss, hit
