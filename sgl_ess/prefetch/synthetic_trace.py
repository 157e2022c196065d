"""A SYNTHETIC top-k trace with DeepSeek-V3.2's measured locality statistics (numpy only, no torch).

Calibrated to two measurements, and to nothing else:
  * raw overlap of the top-2048 sets of adjacent decode steps: ~44% (35-50%) in layers 20-60 and
    ~1.5% in layers 0-1 (TensorRT-LLM's GVR study: DeepSeek-V3.2, 68K-token prompt, 2,025 steps);
  * the per-layer LRU miss profile peaks near layer 17 (the ESS paper, r = 0.2 at 32K).
Everything else is an ASSUMPTION of this generator, stated so a reader can discount it: layers 2-19
ramp linearly between the two measured overlaps; a replaced entry is, with probability 1 - fresh,
a position selected during the last `reuse_window` steps (weighted by reuse_decay ** age since its
last selection), else a fresh position uniform over the context (the same structure as the
simulator's miss model, sgl_ess/sim/hitrate.py). The fresh share has a bump at `peak_layer`, which
is what puts the miss peak there. How predictable misses are on this trace follows from that reuse
assumption, not from DeepSeek-V3.2: predictor results on it measure the predictors against the
assumption.

Per (request, layer) process, step t -> t+1 (S_t = the layer's top-k set at step t):
  keep     each entry of S_t with probability overlap_l          (adjacent overlap = overlap_l)
  reuse    of the k - kept new entries, Binomial(., 1 - fresh_l) from the recent positions not in
           S_t, weight reuse_decay_l ** (t - last selection)
  fresh    the rest uniformly over [0, seq_len) minus everything above
The context grows by one token per decode step. Scale: top-k 256 over a 4K context (the 2048 / 32K
ratio), 61 layers, 200 steps by default: seconds, not minutes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from sgl_ess.prefetch.trace_format import Trace, make_header

SYNTHETIC_NOTE = ("SYNTHETIC trace (sgl_ess.prefetch.synthetic_trace): calibrated only to DeepSeek-V3.2's "
                  "adjacent-step top-k overlap (TensorRT-LLM GVR study) and miss-profile peak (ESS paper); "
                  "the reuse process that makes misses predictable is an assumption")


@dataclass(frozen=True)
class SyntheticTraceConfig:
    num_layers: int = 61
    topk: int = 256
    context_tokens: int = 4096          # prompt length per request; grows by one per decode step
    steps: int = 200                    # decode steps
    requests: int = 2
    hot_slots_per_request: int = 820    # r = 0.2 of the context; replays use it unless told otherwise
    warmup_sets: int = 8                # prefill top-k sets emitted as the LRU warmup before decode
    seed: int = 0
    low_overlap: float = 0.015          # measured: layers [0, low_layers)
    low_layers: int = 2
    high_overlap: float = 0.44          # measured: layers >= high_from ...
    high_from: int = 20
    high_spread: float = 0.05           # ... per layer high_overlap +- this (inside the measured 0.35-0.50)
    fresh_base: float = 0.05            # assumption: share of new entries that are fresh positions
    fresh_peak: float = 0.30            # assumption: extra fresh share at peak_layer (the miss peak)
    peak_layer: int = 17                # measured: where the miss profile peaks
    peak_width_layers: float = 4.0
    reuse_window: int = 24              # assumption: how far back a reused entry can come from (steps)
    reuse_decay: float = 0.7            # assumption: reuse weight per step of age
    low_reuse_decay: float = 0.3        # assumption: layers 0-1 reuse mostly the last few sets

    def __post_init__(self) -> None:
        for name in ("num_layers", "topk", "context_tokens", "steps", "requests", "hot_slots_per_request"):
            if getattr(self, name) <= 0:
                raise ValueError(f"synthetic trace {name}={getattr(self, name)}: expected > 0")
        if self.topk * 4 > self.context_tokens:
            raise ValueError(f"synthetic trace topk={self.topk} over context_tokens={self.context_tokens}: expected "
                             "a context of at least 4 x topk (the model is one of sparse selection)")
        for name in ("low_overlap", "high_overlap", "fresh_base", "reuse_decay", "low_reuse_decay"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"synthetic trace {name}={getattr(self, name)}: expected a fraction in [0, 1]")


def layer_overlap(cfg: SyntheticTraceConfig) -> np.ndarray:
    """The configured adjacent-step overlap per layer (an input; the trace's measured value should match)."""
    out = np.empty(cfg.num_layers)
    for layer in range(cfg.num_layers):
        if layer < cfg.low_layers:
            out[layer] = cfg.low_overlap
        elif layer >= cfg.high_from:
            out[layer] = cfg.high_overlap + cfg.high_spread * math.sin(2 * math.pi * (layer - cfg.high_from) / 11.0)
        else:   # assumption: a linear ramp between the two measured bands
            x = (layer - (cfg.low_layers - 1)) / (cfg.high_from - (cfg.low_layers - 1))
            out[layer] = cfg.low_overlap + x * (cfg.high_overlap - cfg.low_overlap)
    return np.clip(out, 0.0, 1.0)


def layer_fresh(cfg: SyntheticTraceConfig) -> np.ndarray:
    layers = np.arange(cfg.num_layers)
    bump = np.exp(-((layers - cfg.peak_layer) / cfg.peak_width_layers) ** 2)
    return np.clip(cfg.fresh_base + cfg.fresh_peak * bump, 0.0, 1.0)


class _LayerProcess:
    """One (request, layer)'s top-k sets. Owns a last-selection array over the longest context."""

    def __init__(self, rng: np.random.Generator, k: int, ctx: int, max_ctx: int, overlap: float, fresh: float,
                 decay: float, window: int):
        self.rng, self.k, self.overlap, self.fresh, self.decay, self.window = rng, k, overlap, fresh, decay, window
        self.t = 0
        self.last = np.full(max_ctx, -(1 << 40), dtype=np.int64)
        self.cur = rng.choice(ctx, size=k, replace=False).astype(np.int64)
        self.last[self.cur] = 0

    def step(self, seq_len: int) -> np.ndarray:
        rng, k = self.rng, self.k
        kept = self.cur[rng.random(k) < self.overlap]
        n_new = k - kept.size
        age = self.t - self.last[:seq_len]
        age[self.cur] = 0                          # nothing of S_t comes back except `kept`
        pool = np.nonzero((age >= 1) & (age <= self.window))[0]
        n_reuse = min(rng.binomial(n_new, 1.0 - self.fresh), pool.size)
        if n_reuse:     # weighted sampling without replacement: the n largest u ** (1 / w) (Efraimidis-Spirakis)
            keys = np.log(rng.random(pool.size)) / self.decay ** age[pool].astype(np.float64)
            reuse = pool[np.argpartition(-keys, n_reuse - 1)[:n_reuse]]
        else:
            reuse = pool[:0]
        taken = np.zeros(seq_len, dtype=bool)
        taken[self.cur] = True
        taken[reuse] = True
        fresh = _fresh(rng, taken, n_new - n_reuse)
        self.cur = rng.permutation(np.concatenate([kept, reuse, fresh]).astype(np.int64))
        self.t += 1
        self.last[self.cur] = self.t
        return self.cur


def _fresh(rng: np.random.Generator, taken: np.ndarray, n: int) -> np.ndarray:
    """n distinct positions uniform over the untaken ones (rejection sampling: the set is a small
    share of the context)."""
    out = np.empty(0, dtype=np.int64)
    while out.size < n:
        cand = rng.integers(0, taken.size, size=2 * (n - out.size) + 8)
        cand = cand[~taken[cand]]
        cand = cand[np.sort(np.unique(cand, return_index=True)[1])][: n - out.size]
        taken[cand] = True
        out = np.concatenate([out, cand])
    return out


def generate(cfg: SyntheticTraceConfig = SyntheticTraceConfig()) -> Trace:
    """The trace: per request an open, per layer one warmup of `warmup_sets` sets, then per decode step
    and layer a touch of the newest token (the store reserves it before the plan) and one plan of all
    requests."""
    L, k, b = cfg.num_layers, cfg.topk, cfg.requests
    max_ctx = cfg.context_tokens + cfg.steps + 1
    overlap, fresh = layer_overlap(cfg), layer_fresh(cfg)
    root = np.random.SeedSequence(cfg.seed)
    procs = []
    for r, seed in enumerate(root.spawn(b)):
        rngs = [np.random.default_rng(s) for s in seed.spawn(L)]
        procs.append([_LayerProcess(rngs[layer], k, cfg.context_tokens, max_ctx, overlap[layer], fresh[layer],
                                    cfg.low_reuse_decay if layer < cfg.low_layers else cfg.reuse_decay,
                                    cfg.reuse_window) for layer in range(L)])
    header = make_header("synthetic", L, k, max_ctx, cfg.hot_slots_per_request, SYNTHETIC_NOTE,
                         synthetic=dataclasses.asdict(cfg), configured_overlap=[round(float(x), 5) for x in overlap])
    reqs = np.arange(b, dtype=np.int64)
    trace = Trace(header, [{"ev": "open", "req": int(r)} for r in reqs])
    seq = np.full(b, cfg.context_tokens, dtype=np.int64)
    if cfg.warmup_sets:
        for layer in range(L):
            ids = np.stack([np.stack([procs[r][layer].step(cfg.context_tokens) for _ in range(cfg.warmup_sets)])
                            for r in range(b)])
            trace.events.append({"ev": "warmup", "layer": layer, "reqs": reqs, "seq_lens": seq.copy(), "ids": ids})
    for _ in range(cfg.steps):
        seq = seq + 1
        for layer in range(L):
            trace.events.append({"ev": "touch", "layer": layer, "reqs": reqs, "seq_lens": seq.copy(),
                                 "pos": (seq - 1).reshape(b, 1)})
            topk = np.stack([procs[r][layer].step(int(seq[r])) for r in range(b)])
            trace.events.append({"ev": "plan", "layer": layer, "mb": 0, "reqs": reqs, "seq_lens": seq.copy(),
                                 "topk": topk})
    for r in reqs:
        trace.events.append({"ev": "close", "req": int(r)})
    return trace
