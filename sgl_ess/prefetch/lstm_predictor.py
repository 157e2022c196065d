"""lstm: a small learned sequence model of which positions a layer selects next (CPU inference).

Trained offline (`python -m sgl_ess.prefetch.train_lstm --trace FILE --out CKPT`), loaded at start
from --ess-predictor-checkpoint (a missing or incompatible file is refused with the reason). Per
(request, layer) a PositionTable tracks the recently selected positions with their LSTM state
(h, c) and their last P(selected next). When a layer plans, every tracked position of every
request in the plan advances one LSTM step in ONE batched call (features: lstm_model.py); the
prediction for a target layer is its tracked positions that are not in its latest selection with
P >= the checkpoint's threshold, most probable first.

Cost: one nn.LSTM step over (requests x tracked positions) rows per layer, plus numpy bookkeeping per
request (see `python -m bench prefetch --predictors lstm` for the measured time per step).
Memory per request: L x capacity x (17 + 4 (2 hidden + 1)) bytes; `forget` drops it.
"""
from __future__ import annotations

import numpy as np
import torch

from sgl_ess.prefetch.lstm_model import features, load_checkpoint
from sgl_ess.prefetch.position_table import PositionTable
from sgl_ess.prefetch.predictors import Predictor, as_numpy, pad_rows


class LstmPredictor(Predictor):
    name = "lstm"

    def __init__(self, ctx=None, model=None, meta: dict | None = None, capacity: int | None = None,
                 max_predictions: int | None = None, threshold: float | None = None):
        super().__init__(ctx)
        if model is None:
            model, meta = load_checkpoint(ctx.checkpoint if ctx is not None else "")
        self.model, self.meta = model, meta or {}
        self.hidden = model.hidden
        self.horizon = int(self.meta.get("horizon", 24))
        self.threshold = float(threshold if threshold is not None else self.meta.get("threshold", 0.1))
        k = ctx.topk if ctx is not None else 2048
        self.capacity = capacity or 8 * k
        self.max_predictions = max_predictions or self.capacity   # the stager skips resident ones, in order
        self.tables: dict[int, dict[int, PositionTable]] = {}

    def _table(self, req: int, layer: int) -> PositionTable:
        per = self.tables.setdefault(req, {})
        if layer not in per:
            per[layer] = PositionTable(2 * self.hidden + 1, self.horizon, self.capacity)
        return per[layer]

    def observe(self, layer: int, num_layers: int, reqs: list[int], seq_lens: np.ndarray, topk: np.ndarray) -> None:
        tables = []
        for i, req in enumerate(reqs):
            t = self._table(req, layer)
            t.observe(topk[i])
            tables.append(t)
        sizes = [len(t) for t in tables]
        if not sum(sizes):
            return
        x = np.concatenate([features(t.x, t.age(), t.pos, int(seq_lens[i]), layer, num_layers, self.horizon)
                            for i, t in enumerate(tables)])
        state = torch.from_numpy(np.concatenate([t.state for t in tables]))
        h, c = state[:, :self.hidden], state[:, self.hidden:2 * self.hidden]
        logit, h1, c1 = self.model.step(torch.from_numpy(x), h, c)
        out = torch.cat([h1, c1, torch.sigmoid(logit).unsqueeze(1)], dim=1).numpy()
        start = 0
        for t, n in zip(tables, sizes):
            t.state[:] = out[start:start + n]
            start += n

    def ranked(self, req: int, layer: int) -> np.ndarray:
        t = self.tables.get(req, {}).get(layer)
        if t is None or not len(t):
            return np.empty(0, dtype=np.int64)
        p = t.state[:, -1]
        cand = np.nonzero(~t.x & (p >= self.threshold))[0]
        cand = cand[np.argsort(-p[cand], kind="stable")][:self.max_predictions]
        return t.pos[cand]

    def learn(self, layer, num_layers, reqs, seq_lens, topk):
        self.observe(layer, num_layers, as_numpy(reqs).tolist(), as_numpy(seq_lens), as_numpy(topk))

    def forecast(self, layer, num_layers, reqs):
        target = (layer + 1) % num_layers
        return target, pad_rows([self.ranked(req, target) for req in as_numpy(reqs).tolist()])

    def forget(self, req: int) -> None:
        self.tables.pop(int(req), None)

    def stats(self) -> dict:
        return {"requests_tracked": len(self.tables), "threshold": self.threshold,
                "entries": sum(len(t) for per in self.tables.values() for t in per.values())}
