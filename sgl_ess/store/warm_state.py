"""LRU warm state in closed form: the hot-buffer state that an LRU over the prefill's accesses
ends in, set in a fixed number of whole-batch ops (no loop over the W warmup positions).

The accesses are the top-k sets of the prefill's last W query positions, oldest first, read as
one stream (position w's set in its top-k order, then position w + 1's). An exact LRU of N slots
fed that stream holds the N distinct tokens with the latest last access, in that order
(`LruOracle` fed one token per step; test_warmup.py checks it). So per request:

  1. last access: the token scratch map (`DeviceHotBuffer.token_map`) gets 1 + each token's
     last stream index (scatter amax); the entry at that index is the token's last occurrence.
  2. residents: the N latest last occurrences (topk), most recent first.
  3. state: the residents fill the last slots, oldest first, and the empty slots the front, so
     the LRU order list is the identity (empty slots first, then least -> most recent).
     Fast rows (seq_len <= N: slot = token position, never evicting) hold their whole context;
     their order list is the untouched slots (ascending), then the touched ones by last access.
  4. the map is zeroed again (only the cells written).

This REPLACES the request's state (warmup follows `open`). It differs from replaying W decode
steps (`resolver.assign` W times, which puts a step's hits before its misses) only in the
order inside one position's set; it costs ~20 ops instead of ~90 per position.
"""
from __future__ import annotations

import torch

from sgl_ess.store.hot_buffer import DeviceHotBuffer


def set_warm_state(buf: DeviceHotBuffer, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor,
                   ids: torch.Tensor) -> torch.Tensor:
    """reqs int64 [b] (unique, opened), seq_lens int64 [b], ids int64 [b, W, k] token positions
    (-1 padded, already checked to lie below seq_lens), all on `buf.device`.
    Writes slot_to_token and lru_order of (layer, reqs); returns the new slot_to_token [b, N]."""
    b = reqs.numel()
    n = buf.slots_per_request
    dev = buf.device
    stream = ids.reshape(b, -1)
    length = stream.shape[1]
    tmap = buf.token_map_for(seq_lens)
    ctx = tmap.shape[1] - 1
    flat_map = tmap.view(-1)
    valid = (stream >= 0) & (stream < ctx)
    base = (reqs * (ctx + 1) + 1).unsqueeze(1)    # flat cell of token 0; cell 0 of a row stays 0
    at = torch.where(valid, base + stream, 0).view(-1)
    idx1 = torch.arange(1, length + 1, device=dev, dtype=torch.int32).expand(b, length)

    # 1. last access of every token; 2. the N latest, most recent first (-1: fewer than N)
    flat_map.scatter_reduce_(0, at, torch.where(valid, idx1, 0).reshape(-1), "amax")
    is_last = valid & (flat_map.gather(0, at).view(b, length) == idx1)
    recency = torch.where(is_last, idx1.long(), 0)
    if length < n:
        recency = torch.cat([recency, recency.new_zeros((b, n - length))], dim=1)
        stream = torch.cat([stream, stream.new_full((b, n - length), -1)], dim=1)
    top, where = torch.topk(recency, n, dim=1)
    residents = torch.where(top > 0, stream.gather(1, where), -1)

    # 3. oldest resident in slot N - m, newest in slot N - 1; fast rows: slot = position
    ar = torch.arange(n, device=dev).expand(b, n)
    fast = (seq_lens <= n).unsqueeze(1)
    s2t = torch.where(fast, torch.where(ar < seq_lens.unsqueeze(1), ar, -1), residents.flip(1))
    slot_key = flat_map.gather(0, (base + s2t).view(-1)).view(b, n)   # 1 + last access, 0 untouched
    order = torch.sort(slot_key, dim=1, stable=True).indices
    buf.slot_to_token[layer].index_copy_(0, reqs, s2t)
    buf.lru_order[layer].index_copy_(0, reqs, order.to(torch.int32))

    # 4. the scratch map is all zero again
    flat_map.scatter_(0, at, 0)
    return s2t


def lru_tokens(buf: DeviceHotBuffer, req: int) -> torch.Tensor:
    """int64 [num_layers, N]: request `req`'s hot-buffer tokens in LRU order (least -> most recently
    used, -1 for an empty slot). With the request's seq_len this is its whole LRU state
    (`set_state_from_lru_tokens`); a PD prefill node sends it to the decode node (pd_warmup.py)."""
    return buf.slot_to_token[:, req].gather(1, buf.lru_order[:, req].long())


def state_from_lru_tokens(tokens: torch.Tensor, seq_len: int, n: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rebuild (slot_to_token int64 [L, N], lru_order int32 [L, N]) from `lru_tokens` output for a
    request of `seq_len` tokens; None when `tokens` is not the LRU order of a valid state (then the
    caller starts the request cold).

    Fast rows (seq_len <= N) keep slot = position: a token t sits in slot t and the empty slots
    (-1 entries) are slots seq_len.. in ascending order, as they are in every state the store
    makes. Other rows get slot i = the i-th least recently used token (order = identity): a
    relabelling of slots, the same LRU state (hits, misses and evictions are unchanged)."""
    if tokens.dim() != 2 or tokens.shape[1] != n:
        return None
    tokens = tokens.to(torch.int64)
    valid = tokens >= 0
    if bool((tokens >= seq_len).any()) or bool((tokens < -1).any()):
        return None
    ar = torch.arange(n, device=tokens.device).expand_as(tokens)
    if seq_len <= n:
        empties = torch.cumsum(~valid, dim=1) - 1
        order = torch.where(valid, tokens, seq_len + empties)
        if not torch.equal(torch.sort(order, dim=1).values, ar):    # not a permutation of 0..N-1
            return None
        s2t = torch.where(ar < seq_len, ar, -1)
        return s2t.contiguous(), order.to(torch.int32)
    srt = torch.sort(torch.where(valid, tokens, -1 - ar), dim=1).values    # -1-ar: empties never collide
    if bool((srt[:, 1:] == srt[:, :-1]).any()):                              # a token held twice
        return None
    return tokens.clone(), ar.to(torch.int32).contiguous()
