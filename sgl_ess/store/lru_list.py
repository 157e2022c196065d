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
    tmap = buf.token_map_for(seq_lens)                                       # [R + 1, ctx] int32
    ctx = tmap.shape[1]
    dev = tokens.device
    ar_k = torch.arange(k, device=dev).expand(b, k)
    ar_n = torch.arange(n, device=dev).expand(b, n)

    real = reqs >= 0
    if num_real_reqs is not None:
        real = real & (torch.arange(b, device=dev) < num_real_reqs.reshape(()).to(dev))
    row = torch.where(real, reqs, buf.max_requests)                          # padded -> trash row
    s2t = buf.slot_to_token_ext[layer].index_select(0, row)                  # [b, n]
    order32 = buf.lru_order_ext[layer].index_select(0, row)                  # [b, n] (a copy)
    order = order32.long()
    fast = (seq_lens <= n).unsqueeze(1) & real.unsqueeze(1)                  # [b, 1]
    slow = (seq_lens > n).unsqueeze(1) & real.unsqueeze(1)
    valid = (tokens >= 0) & (tokens < ctx) & (slow | (fast & (tokens < n)))
    flat_map = tmap.view(-1)
    base = (row * ctx).unsqueeze(1)
    trash = buf.max_requests * ctx                                           # a trash-row cell

    # 1. dedup through the token map: 1 + last index of every selected token; first occurrence
    at = torch.where(valid, base + tokens, trash)                            # [b, k]
    flat_map.scatter_reduce_(0, at.reshape(-1), (ar_k + 1).reshape(-1).to(torch.int32), "amax")
    last = torch.where(valid, flat_map.gather(0, at.reshape(-1)).view(b, k).long() - 1, k)
    first_of = torch.full((b, k + 1), k, dtype=torch.int64, device=dev)
    first_of.scatter_reduce_(1, last, ar_k.contiguous(), "amin")
    is_first = valid & (first_of.gather(1, last) == ar_k)
    is_last = valid & (last == ar_k)

    # 2. lookup against the start-of-step state. Slow rows: the resident slots whose token is
    #    selected; fast rows: slot t holds token t if any
    s2t_at = torch.where(slow & (s2t >= 0) & (s2t < ctx), base + s2t, trash)  # [b, n]
    slot_last = flat_map.gather(0, s2t_at.reshape(-1)).view(b, n).long()      # 1 + last index
    pinned = (s2t_at != trash) & (slot_last > 0)
    by_last = torch.full((b, k + 1), -1, dtype=torch.int64, device=dev)      # slot by last index
    by_last.scatter_(1, torch.where(pinned, slot_last - 1, k), ar_n)
    safe_tok = torch.where(valid, tokens, 0)
    held = s2t.gather(1, safe_tok.clamp(max=n - 1)) == tokens
    by_last.scatter_(1, torch.where(valid & fast & held, last, k), safe_tok)
    flat_map.scatter_(0, at.reshape(-1), 0)                                  # map all zero again
    found = valid & (by_last.gather(1, last) >= 0)
    touched = torch.zeros((b, n + 1), dtype=torch.bool, device=dev)
    touched = touched.scatter_(1, torch.where(valid & fast, safe_tok, n), True)[:, :n]
    removed = pinned | touched                                                # per slot

    miss = is_first & ~found
    hit = is_first & found
    m = miss.sum(dim=1, keepdim=True)
    h = hit.sum(dim=1, keepdim=True)

    # 3. victims: the first m unpinned slots of the order list (none on the fast path)
    free = ~removed.gather(1, order)                                          # [b, n] by rank
    n_free = torch.cumsum(free, dim=1) - free.long()                          # exclusive
    m_victims = torch.where(fast, 0, m)
    victim = free & (n_free < m_victims)
    kept = free & ~victim
    victims = torch.zeros((b, k + 1), dtype=torch.int64, device=dev)
    victims.scatter_(1, torch.where(victim, n_free, k), order)
    miss_rank = (torch.cumsum(miss, dim=1) - 1).clamp(min=0)
    slot_at = torch.where(fast, safe_tok, torch.where(found, by_last.gather(1, last),
                                                       victims.gather(1, miss_rank)))
    slots = torch.where(valid, slot_at.gather(1, torch.where(valid, first_of.gather(1, last), 0)), -1)

    # 4. new order, written straight into the state (a permutation: every rank written once;
    #    padded rows only write the trash row): kept slots (compacted), then hits, then misses,
    #    each group by last occurrence
    hit_last = is_last & found
    miss_last = is_last & ~found
    order_flat = buf.lru_order_ext[layer].view(-1)
    row_base = (row * n).unsqueeze(1)
    trash_slot = buf.max_requests * n
    slots32 = slots.clamp(min=0).to(torch.int32)  # masked lanes write the trash cell: keep it a slot
    order_flat.scatter_(0, torch.where(kept, row_base + n_free - m_victims, trash_slot).view(-1),
                        order32.view(-1))
    hit_pos = row_base + n - h - m + torch.cumsum(hit_last, dim=1) - 1
    order_flat.scatter_(0, torch.where(hit_last, hit_pos, trash_slot).view(-1), slots32.view(-1))
    miss_pos = row_base + n - m + torch.cumsum(miss_last, dim=1) - 1
    order_flat.scatter_(0, torch.where(miss_last, miss_pos, trash_slot).view(-1), slots32.view(-1))

    # 5. misses take their slots (the evicted tokens are overwritten)
    s2t_flat = buf.slot_to_token_ext[layer].view(-1)
    s2t_flat.scatter_(0, torch.where(miss, row_base + slots, trash_slot).view(-1), tokens.reshape(-1))
    return slots, miss, hit
