"""StoreMemory: the tensors a fetch engine moves rows between, and how a worker maps them.

Owned by the store (sgl_ess.store.LatentStore); engines only borrow them.
  host       uint8 [L, T, B]   HostLatentPool.rows
  slots      uint8 [S, B]      SlotSpace.rows
  ring_tags  int64 [G*C]       SlotSpace.ring_tags
  ring_base  int               first ring row in `slots`

`layout()` describes the shared-memory segments behind them (fd, size, offsets, whether the owner
mlocked them) as plain JSON types, so a worker process can `attach()` the same memory: nothing but
this description and small control messages ever crosses a socket. An attached mapping is
protected as the owner's is (excluded from core dumps; mlocked when the owner's is:
sgl_ess.memory.protection). The segments are sgl_ess.memory's, below the store and this room.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from sgl_ess.memory.shared_segment import HOST_LABEL, SLOTS_LABEL, SharedSegment


@dataclass
class StoreMemory:
    host: torch.Tensor
    slots: torch.Tensor
    ring_tags: torch.Tensor
    ring_base: int
    host_segment: SharedSegment | None = None
    slot_segment: SharedSegment | None = None

    @property
    def shareable(self) -> bool:
        """True when a worker process can map all of it (both segments exist, CPU placement)."""
        return self.host_segment is not None and self.slot_segment is not None

    def fds(self) -> list[int]:
        return [self.host_segment.fd, self.slot_segment.fd] if self.shareable else []

    def layout(self) -> dict:
        """JSON-able description for `attach` in another process (same fd numbers there)."""
        if not self.shareable:
            raise RuntimeError("StoreMemory.layout: this memory is not in shared segments "
                               "(CUDA placement): use the inline engine, or --ess-prefetch-engine inline")
        L, T, B = self.host.shape
        S = self.slots.shape[0]
        return {
            "host": {"fd": self.host_segment.fd, "nbytes": self.host_segment.nbytes, "shape": [L, T, B],
                     "lock": self.host_segment.locked},
            "slots": {"fd": self.slot_segment.fd, "nbytes": self.slot_segment.nbytes, "shape": [S, B],
                      "tags_offset": S * B, "tags_len": int(self.ring_tags.numel()), "lock": self.slot_segment.locked},
            "ring_base": self.ring_base,
        }

    @classmethod
    def attach(cls, layout: dict) -> "StoreMemory":
        h, s = layout["host"], layout["slots"]
        hseg = SharedSegment.attach(h["fd"], h["nbytes"], HOST_LABEL, lock=bool(h.get("lock")))
        sseg = SharedSegment.attach(s["fd"], s["nbytes"], SLOTS_LABEL, lock=bool(s.get("lock")))
        return cls(host=hseg.tensor(torch.uint8, tuple(h["shape"])),
                   slots=sseg.tensor(torch.uint8, tuple(s["shape"])),
                   ring_tags=sseg.tensor(torch.int64, (s["tags_len"],), offset_bytes=s["tags_offset"]),
                   ring_base=layout["ring_base"], host_segment=hseg, slot_segment=sseg)
