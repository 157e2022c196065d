"""Predictors for the speculative prefetch tier: which rows a layer will ask for before it asks.

After each plan of layer l (top-k `topk` of requests `reqs`), the store's SpeculativeStager asks
its predictor for `(target_layer, positions [b, m])`: positions of the same requests that
`target_layer` is likely to select at its next plan, best first, -1 padded. The stager stages the
ones not resident there (at most its per-request share of the speculative rows), with spare
bandwidth only (tier "speculative", dropped when late); a prediction is never needed for
correctness, and precision (rows used / rows staged) is counted. When the precision over a window
drops below --ess-predictor-min-precision, the stager falls back to plain LRU (stages nothing) and
keeps scoring the predictions in shadow until they are good again (precision_gate.py).

Where this runs: inside `LatentStore.plan`, i.e. on the thread that plans (SGLang's scheduler
thread: the indexer hand-off or the attention backend), between submitting layer l's fetch and
returning to the model. Its CPU time is on the scheduler's critical path unless the fetch it
overlaps is longer; the stager counts it (`predict_us`) and `python -m bench prefetch --predictors`
measures it per step.

  name        target            what it predicts                                 file
  next_layer  l + 1             layer l's selection (cross-layer similarity)     here
  last_step   l + 1 (wraps)     that layer's previous selection (temporal)       last_step.py
  score_ema   l + 1 (wraps)     top positions by an EMA of selection frequency   score_ema.py
  lstm        l + 1 (wraps)     a small LSTM's P(selected next) per position     lstm_predictor.py
On CUDA (the side-stream engine) a predictor with `host_inputs` learns from each plan's top-k a
little after the plan ran (an asynchronous copy, never a sync); next_layer reads the device top-k.
"wraps": after the last layer the target is layer 0 of the next step. Temporal predictors predict a
layer's next selection just before that layer runs, so they need only the two speculative regions
(layer parities) the slot space already has.

Add one: subclass `Predictor`, list "module:Class" in PREDICTORS (imported only when selected), add
the name to the choices of speculative_prefetch (sgl_ess/config.py derives them from this table).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class PredictorContext:
    """What a predictor may size itself by. checkpoint: --ess-predictor-checkpoint (lstm)."""
    num_layers: int
    topk: int
    max_context_tokens: int
    checkpoint: str = ""


class Predictor:
    name = "abstract"
    # reads its inputs on the host (numpy): on a device-ordered engine (CUDA) the stager hands it
    # each plan's top-k once an asynchronous copy has landed (store/host_feed.py), never by a sync
    host_inputs = True

    def __init__(self, ctx: PredictorContext | None = None):
        self.ctx = ctx

    def predict(self, layer: int, num_layers: int, reqs, seq_lens, topk):
        """Layer `layer` planned with top-k `topk` [b, k] (int, -1 padded) for requests `reqs` [b]
        at `seq_lens` [b] (torch or numpy, any device). -> (target_layer, positions int64 [b, m],
        -1 padded, best first) or None. May update per-request state. A host predictor is `learn`
        then `forecast`; the CUDA stager calls the two apart (it learns from top-k a little late)."""
        self.learn(layer, num_layers, reqs, seq_lens, topk)
        return self.forecast(layer, num_layers, reqs)

    def learn(self, layer: int, num_layers: int, reqs, seq_lens, topk) -> None:
        """Update the per-request state from layer `layer`'s selection (host tensors or arrays)."""
        raise NotImplementedError

    def forecast(self, layer: int, num_layers: int, reqs):
        """After layer `layer` planned: (target_layer, positions int64 [b, m], -1 padded, best first)
        for requests `reqs` [b] from the state alone, or None."""
        raise NotImplementedError

    def forget(self, req: int) -> None:
        """Request index `req` finished or was reused: drop everything kept for it."""

    def stats(self) -> dict:
        return {}


class NextLayerPredictor(Predictor):
    """Layer l+1 selects what layer l selected (cross-layer similarity of DSA's top-k). Stateless."""

    name = "next_layer"
    host_inputs = False       # returns the device top-k as it is

    def predict(self, layer, num_layers, reqs, seq_lens, topk):
        if layer + 1 >= num_layers:
            return None
        return layer + 1, topk


PREDICTORS = {
    "off": None,
    "next_layer": "sgl_ess.prefetch.predictors:NextLayerPredictor",
    "last_step": "sgl_ess.prefetch.last_step:LastStepPredictor",
    "score_ema": "sgl_ess.prefetch.score_ema:ScoreEmaPredictor",
    "lstm": "sgl_ess.prefetch.lstm_predictor:LstmPredictor",
}


def as_numpy(x):
    """A torch tensor (any device; one host copy) or array-like -> numpy int64 array."""
    import numpy as np      # here, not at the top: sgl_ess.config reads PREDICTORS before anything heavy

    if hasattr(x, "detach"):
        x = x.detach().to("cpu").numpy()
    return np.asarray(x, dtype=np.int64)


def pad_rows(rows: list):
    """Ragged int rows (numpy) -> int64 [b, max len], -1 padded (at least one column)."""
    import numpy as np

    out = np.full((len(rows), max([1] + [r.size for r in rows])), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, :r.size] = r
    return out


def make_predictor(name: str, ctx: PredictorContext | None = None) -> Predictor | None:
    if name not in PREDICTORS:
        raise ValueError(f"speculative prefetch {name!r}: expected one of {', '.join(PREDICTORS)} "
                         "(--ess-speculative-prefetch)")
    spec = PREDICTORS[name]
    if spec is None:
        return None
    module, cls = spec.split(":")
    return getattr(importlib.import_module(module), cls)(ctx)
