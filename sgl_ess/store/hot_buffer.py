"""DeviceHotBuffer: the exact-LRU state of every (layer, request) hot buffer.

The rows themselves live in the store's SlotSpace (slot_space.py); this object holds only which
token each slot holds and the LRU order of the slots. Memory (all on `device`, owned here,
allocated once, never reallocated - so a CUDA graph may capture kernels that update it):

  slot_to_token int64 [num_layers, max_requests, N]  token position held by each slot, -1 empty
  lru_order     int32 [num_layers, max_requests, N]  a permutation of 0..N-1 per (layer,
                request): the slots from least to most recently used. Slots never used (empty)
                sit at the front, so "take the first non-hit slots" picks empty slots first,
                then the least recently used ones.
  token_map     int32 [max_requests + 1, C + 1]: the resolver's scratch, all zero between calls:
                column t + 1 of row r = 1 + the last index of token t in request r's top-k
                (column 0 stays 0: an empty slot, -1, reads it). C = max_context_tokens
                when given (allocated here, fixed: required by the Triton resolver); otherwise
                the torch resolver allocates it on first use and grows it to the longest
                context seen (`token_map_for`, a host sync per call - the CPU path only).

Both state tensors are views of [num_layers, max_requests + 1, N] storage whose extra last row
is a write-only trash row: padded batch rows of the torch resolver write there, so padding needs
no host-side masking. Request index r (an engine's request-pool index) owns slots
r*N .. r*N+N-1 of each layer. No Python-side per-step state: the LRU order is explicit, not a
host clock, so a captured graph replays correctly.
"""
from __future__ import annotations

import torch


class DeviceHotBuffer:
    def __init__(self, num_layers: int, max_requests: int, slots_per_request: int,
                 device: torch.device | str, max_context_tokens: int | None = None):
        self.num_layers = num_layers
        self.max_requests = max_requests
        self.slots_per_request = slots_per_request
        self.max_context_tokens = max_context_tokens
        self.device = torch.device(device)
        n, r = slots_per_request, max_requests
        self.slot_to_token_ext = torch.full((num_layers, r + 1, n), -1, dtype=torch.int64,
                                            device=self.device)
        self.lru_order_ext = torch.arange(n, dtype=torch.int32, device=self.device).repeat(
            num_layers, r + 1, 1)
        self.slot_to_token = self.slot_to_token_ext[:, :r]
        self.lru_order = self.lru_order_ext[:, :r]
        # each table's (slot_to_token_ext, lru_order_ext) rows as views made once: the resolver takes
        # them every layer-step, and a select per call is host work (the storage is never reallocated)
        self.layer_state = [(self.slot_to_token_ext[t], self.lru_order_ext[t]) for t in range(num_layers)]
        self.token_map = None
        if max_context_tokens is not None:
            if max_context_tokens <= 0:
                raise ValueError(f"max_context_tokens={max_context_tokens}: expected > 0 "
                                 "(StoreConfig.max_context_tokens, --context-length)")
            self.token_map = self._new_map(max_context_tokens)
        self.is_open = [False] * max_requests

    def reset(self, req: int) -> None:
        """Empty request `req`'s LRU state in every layer."""
        self.slot_to_token[:, req] = -1
        self.lru_order[:, req] = torch.arange(self.slots_per_request, dtype=torch.int32,
                                              device=self.device)

    def token_map_for(self, seq_lens: torch.Tensor) -> torch.Tensor:
        """The scratch map, wide enough for positions < max(seq_lens) (and < N for the fast
        path). Fixed when `max_context_tokens` was given (no host sync; positions beyond it are
        treated as padding); else grown on demand (reads seq_lens back: a host sync)."""
        if self.max_context_tokens is not None:
            return self.token_map
        need = max(int(seq_lens.max()) if seq_lens.numel() else 0, self.slots_per_request)
        if self.token_map is None or self.token_map.shape[1] - 1 < need:
            self.token_map = self._new_map(1 << (need - 1).bit_length())
        return self.token_map

    def _new_map(self, width_tokens: int) -> torch.Tensor:
        return torch.zeros((self.max_requests + 1, width_tokens + 1), dtype=torch.int32,
                           device=self.device)

    def used_slots(self) -> int:
        """Occupied (request, layer, slot) triples across the buffer (host sync: metrics only)."""
        return int((self.slot_to_token >= 0).sum())

    @property
    def stamps(self) -> torch.Tensor:
        """int64 [num_layers, max_requests, N]: each occupied slot's recency rank (larger = more
        recently used), -1 for empty slots. Derived from `lru_order` (a fresh tensor; tests and
        metrics only)."""
        n = self.slots_per_request
        rank = torch.empty_like(self.lru_order, dtype=torch.int64)
        ar = torch.arange(n, device=self.device).expand_as(rank)
        rank.scatter_(2, self.lru_order.long(), ar.contiguous())
        return torch.where(self.slot_to_token >= 0, rank, torch.full_like(rank, -1))
