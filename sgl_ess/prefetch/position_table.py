"""PositionTable: the positions one (request, layer) selected recently, each with a small state.

The shared bookkeeping of the history predictors (score_ema, lstm). Plain numpy, owned by the
predictor that made it, dropped with its request (`Predictor.forget`).

  pos    int64 [C]     token positions, sorted
  last   int64 [C]     the table's step of each position's last selection
  state  float32 [C, d] the predictor's per-position state (EMA score, LSTM h and c, ...)
  x      bool [C]      selected in the latest observed step
An entry not selected for `horizon` steps is dropped; past `capacity` entries the least recently
selected go first. Memory per table <= capacity x (17 + 4 d) bytes.
"""
from __future__ import annotations

import numpy as np


class PositionTable:
    def __init__(self, state_dim: int, horizon: int, capacity: int):
        self.horizon, self.capacity = horizon, capacity
        self.t = 0
        self.pos = np.empty(0, dtype=np.int64)
        self.last = np.empty(0, dtype=np.int64)
        self.state = np.zeros((0, state_dim), dtype=np.float32)
        self.x = np.empty(0, dtype=bool)

    def __len__(self) -> int:
        return self.pos.size

    def observe(self, selected: np.ndarray) -> np.ndarray:
        """Advance one step with the step's selection (token positions, -1 padding ignored). New
        positions enter with a zero state. Returns the indices of the entries that are new."""
        sel = np.unique(selected[selected >= 0]).astype(np.int64)
        self.t += 1
        idx = np.searchsorted(self.pos, sel)
        found = idx < self.pos.size
        found[found] = self.pos[idx[found]] == sel[found]
        add, at = sel[~found], idx[~found]
        self.pos = np.insert(self.pos, at, add)
        self.last = np.insert(self.last, at, self.t)
        self.state = np.insert(self.state, at, 0.0, axis=0)
        self.x = np.zeros(self.pos.size, dtype=bool)
        where = np.searchsorted(self.pos, sel)           # every selected entry, old and new
        self.x[where] = True
        self.last[where] = self.t
        new_idx = at + np.arange(at.size)                # insertion points shift by the entries before them
        keep = (self.t - self.last) < self.horizon
        if keep.sum() > self.capacity:
            order = np.argsort(self.last, kind="stable")
            keep[order[:keep.size - self.capacity]] = False
        if not keep.all():
            remap = np.cumsum(keep) - 1
            new_idx = remap[new_idx[keep[new_idx]]]
            self.pos, self.last, self.state, self.x = self.pos[keep], self.last[keep], self.state[keep], self.x[keep]
        return new_idx

    def age(self) -> np.ndarray:
        """int64 [C]: steps since each entry's last selection (0 = selected in the latest step)."""
        return self.t - self.last
