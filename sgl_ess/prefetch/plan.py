"""CopyPlan: one batch of latent-row moves, the unit every fetch engine executes.

A plan names rows in three spaces, all owned by the store (sgl_ess.store):
  host   HostLatentPool.rows   uint8 [L, T, B]  (row = (layer, host location))
  slots  SlotSpace.rows        uint8 [S, B]     (hot buffers + staging rings, flat)
  tags   SlotSpace.ring_tags   int64 [G*C]      (sequence number of the plan that last filled a ring slot)

kinds (src -> dst, index i copies src[src_idx[i]] -> dst[dst_idx[i]]; -1 entries are skipped):
  "h2s"   host layer `layer` -> slot space           (misses, warmup, speculative staging)
  "s2h"   slot space -> host layer `layer`           (write-back of new rows)
  "s2s"   slot space -> slot space
  "move"  slot space -> slot space, then the source rows are zeroed and their tags set to -1
          (commit: landed ring / speculative rows -> their LRU slots; staged rows hold user data
          and must not outlive the step that read them)
  "zero"  zero host rows `dst_idx` in EVERY layer    (released rows hold user data; src_idx unused)
After the copy, if `tag_seq >= 0`, every ring slot among the destinations gets tag `tag_seq`
(destinations below `ring_base` are hot slots and carry no tag).

tiers (served in this order by a bandwidth scheduler): "immediate" (a step waits on it),
"background" (warmup, write-back, zeroing: must finish, nobody waits now), "speculative"
(predicted rows: only with spare bandwidth, dropped once `deadline_s` (time.monotonic) passed;
never needed for correctness).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

KINDS = ("h2s", "s2h", "s2s", "move", "zero")
TIERS = ("immediate", "background", "speculative")


@dataclass
class CopyPlan:
    kind: str
    src_idx: torch.Tensor            # int64 [M] (CPU for worker engines), -1 = skip
    dst_idx: torch.Tensor            # int64 [M], -1 = skip
    layer: int = 0                   # host-pool layer for h2s / s2h
    tier: str = "immediate"
    micro_batch: int = 0
    tag_seq: int = -1
    deadline_s: float | None = None
    plan_id: int = -1                # set by the engine at submit
    note: str = field(default="", compare=False)   # free text for logs

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"CopyPlan kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.tier not in TIERS:
            raise ValueError(f"CopyPlan tier {self.tier!r}: expected one of {', '.join(TIERS)}")
        if self.src_idx.shape != self.dst_idx.shape or self.dst_idx.dim() != 1:
            raise ValueError(f"CopyPlan: src_idx and dst_idx must be 1-D of one length, got "
                             f"{list(self.src_idx.shape)} and {list(self.dst_idx.shape)}")

    @property
    def num_rows(self) -> int:
        return int(self.dst_idx.numel())
