"""score_ema: positions ranked by an exponential moving average of how often they were selected.

InfiniGen / PRR-style hotness: per (request, layer) every recently selected position p carries
ema(p) <- (1 - alpha) ema(p) + alpha [p selected this step]. For a target layer the prediction is
its top positions by ema that are NOT in its latest selection (those are resident after its own
step), best first; the stager keeps the non-resident ones up to its share of the speculative rows.

State: a PositionTable per (request, layer), entries dropped `horizon` steps after their last
selection (ema < alpha (1 - alpha) ** horizon) and capped at `capacity`: memory per request
<= L x capacity x 21 bytes; all of a request's tables go with `forget`.
"""
from __future__ import annotations

import numpy as np

from sgl_ess.prefetch.position_table import PositionTable
from sgl_ess.prefetch.predictors import Predictor, as_numpy, pad_rows


class ScoreEmaPredictor(Predictor):
    name = "score_ema"

    def __init__(self, ctx=None, alpha: float = 0.3, horizon: int = 24, capacity: int | None = None,
                 max_predictions: int | None = None):
        super().__init__(ctx)
        k = ctx.topk if ctx is not None else 2048
        self.alpha, self.horizon = alpha, horizon
        self.capacity = capacity or 8 * k
        self.max_predictions = max_predictions or self.capacity   # the stager skips resident ones, in order
        self.tables: dict[int, dict[int, PositionTable]] = {}

    def _table(self, req: int, layer: int) -> PositionTable:
        per = self.tables.setdefault(req, {})
        if layer not in per:
            per[layer] = PositionTable(1, self.horizon, self.capacity)
        return per[layer]

    def learn(self, layer, num_layers, reqs, seq_lens, topk):
        r, tk = as_numpy(reqs).tolist(), as_numpy(topk)
        for i, req in enumerate(r):
            t = self._table(req, layer)
            t.observe(tk[i])
            s = t.state[:, 0]
            s *= 1.0 - self.alpha
            s[t.x] += self.alpha

    def forecast(self, layer, num_layers, reqs):
        target = (layer + 1) % num_layers
        return target, pad_rows([self.ranked(req, target) for req in as_numpy(reqs).tolist()])

    def ranked(self, req: int, layer: int) -> np.ndarray:
        t = self.tables.get(req, {}).get(layer)
        if t is None or not len(t):
            return np.empty(0, dtype=np.int64)
        cand = np.nonzero(~t.x)[0]
        m = min(self.max_predictions, cand.size)
        if m == 0:
            return np.empty(0, dtype=np.int64)
        score = t.state[cand, 0]
        best = np.argpartition(-score, m - 1)[:m] if m < cand.size else np.arange(cand.size)
        best = best[np.argsort(-score[best], kind="stable")]
        return t.pos[cand[best]]

    def forget(self, req: int) -> None:
        self.tables.pop(int(req), None)

    def stats(self) -> dict:
        return {"requests_tracked": len(self.tables),
                "entries": sum(len(t) for per in self.tables.values() for t in per.values())}
