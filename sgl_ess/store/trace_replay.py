"""Replay a top-k trace through a real LatentStore (CPU, inline engine): exact LRU misses and what a
speculative predictor would have staged and saved, with nothing but the trace as input.

Every event goes to the store as serving sends it: open / close, warmup, touch (admit_from_host:
the same LRU access as a reserve), plan (then commit). The store's resolver is the exact LRU that
tests/unit/store/test_resolver_vs_oracle.py checks against sgl_ess/core/lru_oracle.py, so "misses"
are exact-LRU misses for `hot_slots` slots per request per layer; staging through the inline
engine always lands in time (lateness is for the caller to model). Latent rows are 1 byte (their
content does not matter here); host location = request x max_context + position.
Memory: the store (layers x requests x max_context bytes of host rows, small at trace scale).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from sgl_ess.prefetch.trace_format import Trace
from sgl_ess.store.config import StoreConfig
from sgl_ess.store.latent_store import LatentStore
from sgl_ess.store.speculative import SpeculativeOptions


@dataclass
class ReplayResult:
    predictor: str
    hot_slots: int
    spec_slots: int
    steps: int                                   # plans of layer 0 (one per decode step and micro-batch)
    plans: int
    rows_per_layer: np.ndarray                   # request-plans per layer
    misses_per_layer: np.ndarray                 # exact-LRU misses, summed
    staged_per_layer: np.ndarray                 # rows staged for that target layer
    used_per_layer: np.ndarray                   # staged rows the layer then missed on (served from spec)
    predict_us: float = 0.0
    predict_calls: int = 0
    gate: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)    # the predictor's stats when the first request closed

    @property
    def misses(self) -> int:
        return int(self.misses_per_layer.sum())

    @property
    def staged(self) -> int:
        return int(self.staged_per_layer.sum())

    @property
    def used(self) -> int:
        return int(self.used_per_layer.sum())


def replay(trace: Trace, speculative: str = "off", hot_slots: int | None = None, spec_rows_per_request: int = 0,
           options: SpeculativeOptions | None = None, predictor=None) -> ReplayResult:
    """`predictor`: an instance to use instead of building `speculative` by name (e.g. an in-memory
    LSTM). spec_rows_per_request: speculative rows per request of the largest plan (0 = topk / 8)."""
    h = trace.header
    L, k, T = int(h["num_layers"]), int(h["topk"]), int(h["max_context_tokens"])
    n = int(hot_slots or h["hot_slots_per_request"])
    reqs_seen = [e["req"] for e in trace.events if e["ev"] in ("open", "close")]
    reqs_seen += [int(e["reqs"].max()) for e in trace.events if "reqs" in e and e["reqs"].size]
    max_req = max(reqs_seen, default=0) + 1
    max_b = max((e["reqs"].size for e in trace.plans()), default=1)
    spec_slots = 0
    if speculative != "off" or predictor is not None:
        spec_slots = max(1, spec_rows_per_request or k // 8) * max_b
    cfg = StoreConfig(num_layers=L, row_bytes=1, host_capacity_tokens=max_req * T, hot_slots_per_request=n,
                      max_requests=max_req, topk=k, max_context_tokens=T, spec_slots=spec_slots)
    store = LatentStore(cfg, transfer_backend="torch", engine="inline",
                        speculative="off" if predictor is not None else speculative, spec_options=options)
    if predictor is not None:
        from sgl_ess.store.speculative import SpeculativeStager

        store.spec = SpeculativeStager(store, predictor, options=options)
    r2h = torch.arange(max_req * T, dtype=torch.int64).view(max_req, T)
    rows = np.zeros(L, dtype=np.int64)
    steps = plans = 0
    state = None
    t = torch.as_tensor
    try:
        for ev in trace.events:
            kind = ev["ev"]
            if kind == "open":
                store.open(ev["req"])
            elif kind == "close":
                if state is None and store.spec is not None:
                    state = store.spec.predictor.stats()
                store.close(ev["req"])
            elif kind == "warmup":
                store.warmup(ev["layer"], t(ev["reqs"]), t(ev["seq_lens"]), t(ev["ids"]), r2h)
            elif kind == "touch":
                store.admit_from_host(ev["layer"], t(ev["reqs"]), t(ev["seq_lens"]), t(ev["pos"]), r2h)
            else:
                step = store.plan(ev["layer"], t(ev["reqs"]), t(ev["seq_lens"]), t(ev["topk"]), r2h,
                                  micro_batch=int(ev.get("mb", 0)) % cfg.ring_micro_batches)
                store.commit(step)
                rows[ev["layer"]] += ev["reqs"].size
                plans += 1
                steps += ev["layer"] == 0
        store.engine.drain()
        snap = store.counters.snapshot()
        spec = store.spec
        return ReplayResult(
            predictor=spec.predictor.name if spec else "off", hot_slots=n, spec_slots=spec_slots, steps=steps,
            plans=plans, rows_per_layer=rows, misses_per_layer=np.asarray(snap["layer_misses"], dtype=np.int64),
            staged_per_layer=np.asarray(spec.staged_by_layer if spec else [0] * L, dtype=np.int64),
            used_per_layer=np.asarray(spec.used_by_layer if spec else [0] * L, dtype=np.int64),
            predict_us=spec.predict_us if spec else 0.0, predict_calls=spec.predict_calls if spec else 0,
            gate=spec.gate.stats() if spec else {}, state=(state or spec.predictor.stats()) if spec else {})
    finally:
        store.shutdown()
