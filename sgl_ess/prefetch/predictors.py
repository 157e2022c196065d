"""Predictors for the speculative prefetch tier: which rows a layer will ask for before it asks.

A predictor sees each plan (layer, request indices, sequence lengths, top-k positions) and may
return `(target_layer, positions [b, m])`: positions of the same requests that `target_layer`
is likely to select. The store stages the ones not already resident there, with spare
bandwidth only (tier "speculative", dropped when late); a prediction is never needed for
correctness, and precision (rows used / rows staged) is counted.

Add one by subclassing `Predictor` and listing it in PREDICTORS (`--ess-speculative-prefetch NAME`).
"""
from __future__ import annotations


class Predictor:
    name = "abstract"

    def predict(self, layer: int, num_layers: int, reqs, seq_lens, topk):
        """-> (target_layer, positions int64 [b, m], -1 padded) or None."""
        raise NotImplementedError


class NextLayerPredictor(Predictor):
    """Layer l+1 selects what layer l selected (cross-layer similarity of DSA's top-k)."""

    name = "next_layer"

    def predict(self, layer, num_layers, reqs, seq_lens, topk):
        if layer + 1 >= num_layers:
            return None
        return layer + 1, topk


PREDICTORS = {"off": None, NextLayerPredictor.name: NextLayerPredictor}


def make_predictor(name: str) -> Predictor | None:
    if name not in PREDICTORS:
        raise ValueError(f"speculative prefetch {name!r}: expected one of {', '.join(PREDICTORS)} "
                         "(--ess-speculative-prefetch)")
    cls = PREDICTORS[name]
    return cls() if cls else None
