"""DeviceHotBuffer: per (request, layer) device slots holding recently used latent rows.

Memory (all on `device`, owned here, allocated once):
  rows          uint8 [num_layers, max_requests * N, row_bytes]  the slots; request row r owns
                slots r*N .. r*N+N-1 of every layer (attention indexes this buffer directly)
  slot_to_token int64 [num_layers, max_requests, N]  token position held by each slot, -1 empty
  stamps        int64 [num_layers, max_requests, N]  last-use time for exact LRU, -1 empty
Per-layer clocks are plain Python ints (advanced on the host, never read back from device).
"""
from __future__ import annotations

import torch


class DeviceHotBuffer:
    def __init__(self, num_layers: int, max_requests: int, slots_per_request: int, row_bytes: int,
                 device: torch.device | str):
        self.num_layers = num_layers
        self.max_requests = max_requests
        self.slots_per_request = slots_per_request
        self.row_bytes = row_bytes
        self.device = torch.device(device)
        n = slots_per_request
        self.rows = torch.zeros((num_layers, max_requests * n, row_bytes), dtype=torch.uint8,
                                device=self.device)
        self.slot_to_token = torch.full((num_layers, max_requests, n), -1, dtype=torch.int64,
                                        device=self.device)
        self.stamps = torch.full_like(self.slot_to_token, -1)
        self.clock = [0] * num_layers
        self.is_open = [False] * max_requests

    def layer_rows(self, layer: int) -> torch.Tensor:
        """uint8 [max_requests * N, row_bytes]: the slots of one layer (a view)."""
        return self.rows[layer]

    def reset(self, row: int) -> None:
        """Empty request row `row` in every layer and zero its slots (they hold user data)."""
        n = self.slots_per_request
        self.slot_to_token[:, row] = -1
        self.stamps[:, row] = -1
        self.rows[:, row * n:(row + 1) * n] = 0

    def used_slots(self) -> int:
        """Occupied (request, layer, slot) triples across the buffer (host sync: metrics only)."""
        return int((self.slot_to_token >= 0).sum())

    def tick(self, layer: int, width: int) -> int:
        """Reserve `width` consecutive stamps on `layer`'s clock; returns the first one."""
        base = self.clock[layer]
        self.clock[layer] = base + width
        return base
