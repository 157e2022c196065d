"""Plain-Python exact LRU oracle for one (request, layer) hot buffer.

This is the reference the vectorised torch resolver (`sgl_ess.store.resolver`) is tested
against. It owns no tensors; state is an OrderedDict token position -> True in recency order
(oldest first). `-1` entries are padding and ignored.

A step touches a whole top-k *set*: hits are decided against the state at the start of the
step (a miss inserted early in the step never evicts an entry the same step selects), then the
misses are inserted, each evicting the least recently used entry when full. Recency after the
step: hits in order of their last occurrence, then misses in order of their last occurrence.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class OracleStep:
    """What one access step did: the hit and miss token positions, in access order."""

    hits: list[int] = field(default_factory=list)
    misses: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)


class LruOracle:
    """Exact LRU over token positions with a fixed capacity (slots)."""

    def __init__(self, capacity_slots: int):
        if capacity_slots <= 0:
            raise ValueError(f"capacity_slots must be > 0, got {capacity_slots}")
        self.capacity_slots = capacity_slots
        self._order: OrderedDict[int, bool] = OrderedDict()

    def __contains__(self, token: int) -> bool:
        return token in self._order

    def __len__(self) -> int:
        return len(self._order)

    def resident(self) -> set[int]:
        return set(self._order)

    def access(self, tokens: Iterable[int]) -> OracleStep:
        """Touch `tokens` in order; misses are inserted, evicting the least recently used."""
        step = OracleStep()
        toks = [int(t) for t in tokens if int(t) >= 0]
        before = set(self._order)
        for t in toks:  # phase 1: hits, against the state at the start of the step
            if t in before:
                self._order.move_to_end(t)
                if t not in step.hits:
                    step.hits.append(t)
        for t in toks:  # phase 2: misses, each evicting the least recently used when full
            if t in before:
                continue
            if t in self._order:
                self._order.move_to_end(t)
                continue
            if len(self._order) >= self.capacity_slots:
                old, _ = self._order.popitem(last=False)
                step.evicted.append(old)
            self._order[t] = True
            step.misses.append(t)
        return step
