"""last_step: a layer's next top-k is its current one (temporal similarity of DSA's top-k).

State: per (request, layer) the last selection, int64 [k] (memory per request: L x k x 8 bytes),
dropped by `forget`. Under exact LRU with more than k slots a layer's last selection is resident
after its own step, so the stager finds little to stage: this predictor is the baseline that shows
what the LRU already captures (rows it evicted between two steps of a layer).
"""
from __future__ import annotations

import numpy as np

from sgl_ess.prefetch.predictors import Predictor, as_numpy, pad_rows


class LastStepPredictor(Predictor):
    name = "last_step"

    def __init__(self, ctx=None):
        super().__init__(ctx)
        self.last: dict[int, dict[int, np.ndarray]] = {}      # req -> layer -> positions

    def learn(self, layer, num_layers, reqs, seq_lens, topk):
        r, tk = as_numpy(reqs).tolist(), as_numpy(topk)
        for i, req in enumerate(r):
            row = tk[i]
            self.last.setdefault(req, {})[layer] = row[row >= 0].copy()

    def forecast(self, layer, num_layers, reqs):
        target = (layer + 1) % num_layers
        return target, pad_rows([self.last.get(req, {}).get(target, np.empty(0, np.int64))
                                 for req in as_numpy(reqs).tolist()])

    def forget(self, req: int) -> None:
        self.last.pop(int(req), None)

    def stats(self) -> dict:
        return {"requests_tracked": len(self.last)}
