"""SlotSpace: the device memory of the ESS store, one flat row space that attention indexes.

Memory (allocated once, owned here): `rows uint8 [total_slots, row_bytes]` holding
  hot buffers    layer l, request r, slot s   -> row  l*R*N + r*N + s
  staging rings  ring group g, ring slot i    -> row  L*R*N + g*C + i
  speculative    parity p, slot i             -> row  L*R*N + G*C + p*C_spec + i  (rows staged
                 for a layer before it asks: the speculative prefetch tier)
  MTP scratch    request row r, row j         -> row  verify_base + r*V + j  (an MTP forward's own
                 window rows and its union's overflow, copied per layer; store/verify_slots.py)
  padding        up to a multiple of 64 rows (FlashMLA views the cache as 64-row pages)
and `ring_tags int64 [G*C + 2*C_spec]`, indexed by row - ring_base: the sequence number of the
fetch that last landed in each ring or speculative slot (-1: none). A reader accepts a ring row only when its tag equals its own plan's sequence number,
so a late or duplicated completion can never pass for another step's data.

One flat space (instead of a tensor per layer plus separate rings) lets a single slot table
address both a layer's hot slots and the ring rows its misses landed in: SGLang's sparse MLA
kernels take one `kv_cache` and one int32 index table.

Placement: on CPU, `rows` and `ring_tags` live in a SharedSegment so the prefetch worker process
writes fetched rows straight into them; like the host pool it is excluded from core dumps, sealed
against resizing and, with `lock=True` (--ess-lock-host-memory), mlocked. On CUDA they are device
tensors (the device layer moves rows with FlashTrans kernels on a side stream): no host memory,
so nothing to exclude or lock.
"""
from __future__ import annotations

import torch

from sgl_ess.memory.shared_segment import SLOTS_LABEL, SharedSegment

from sgl_ess.store.config import PAGE_ROWS   # one page size for the layout and the device budget


class SlotSpace:
    def __init__(self, num_layers: int, max_requests: int, slots_per_request: int, row_bytes: int,
                 ring_groups: int, ring_slots: int, device: torch.device | str, spec_slots: int = 0,
                 lock: bool = False, verify_rows: int = 0):
        self.num_layers = num_layers
        self.max_requests = max_requests
        self.slots_per_request = slots_per_request
        self.row_bytes = row_bytes
        self.ring_groups = ring_groups
        self.ring_slots = ring_slots
        self.spec_slots = spec_slots
        self.device = torch.device(device)
        self.hot_rows_per_layer = max_requests * slots_per_request
        self.ring_base = num_layers * self.hot_rows_per_layer
        self.spec_base = self.ring_base + ring_groups * ring_slots
        tagged = self.spec_base + 2 * spec_slots
        self.verify_base = tagged
        used = tagged + verify_rows
        self.total_slots = -(-used // PAGE_ROWS) * PAGE_ROWS
        if self.total_slots >= 2 ** 31:
            raise ValueError(
                f"slot space of {self.total_slots} rows exceeds int32 slot ids (layers x requests x hot slots "
                "+ ring); lower --ess-hot-slots-per-request or --max-running-requests")
        self.segment: SharedSegment | None = None
        if self.device.type == "cpu":
            tag_bytes = 8 * max(1, tagged - self.ring_base)
            self.segment = SharedSegment(self.total_slots * row_bytes + tag_bytes, label=SLOTS_LABEL, lock=lock)
            self.rows = self.segment.tensor(torch.uint8, (self.total_slots, row_bytes))
            self.ring_tags = self.segment.tensor(torch.int64, (tagged - self.ring_base,),
                                                 offset_bytes=self.total_slots * row_bytes)
        else:
            self.rows = torch.zeros((self.total_slots, row_bytes), dtype=torch.uint8, device=self.device)
            self.ring_tags = torch.empty((tagged - self.ring_base,), dtype=torch.int64, device=self.device)
        self.ring_tags.fill_(-1)

    # --- addressing ---------------------------------------------------------------------
    def hot_base(self, layer: int) -> int:
        """First row of `layer`'s hot buffers."""
        return layer * self.hot_rows_per_layer

    def ring_row(self, group: int, ring_slot) -> int:
        return self.ring_base + group * self.ring_slots + ring_slot

    def spec_row(self, parity: int, spec_slot) -> int:
        return self.spec_base + parity * self.spec_slots + spec_slot

    def layer_rows(self, layer: int) -> torch.Tensor:
        """uint8 [R*N, row_bytes]: the hot slots of one layer (a view)."""
        b = self.hot_base(layer)
        return self.rows[b:b + self.hot_rows_per_layer]

    def ring_group_rows(self, group: int) -> torch.Tensor:
        b = self.ring_row(group, 0)
        return self.rows[b:b + self.ring_slots]

    # --- lifetime ------------------------------------------------------------------------
    def zero_request(self, req: int) -> None:
        """Zero request `req`'s hot slots in every layer (they hold user data)."""
        n = self.slots_per_request
        view = self.rows[:self.ring_base].view(self.num_layers, self.max_requests, n, self.row_bytes)
        view[:, req] = 0

    def clear_speculative(self) -> None:
        """Zero the speculative rows and untag them: predictions staged for any request are dropped
        (never needed for correctness), and no row of a finished request stays behind there."""
        if self.spec_slots:
            self.rows[self.spec_base:self.spec_base + 2 * self.spec_slots] = 0
            self.ring_tags[self.spec_base - self.ring_base:] = -1

    @property
    def nbytes(self) -> int:
        return self.total_slots * self.row_bytes
