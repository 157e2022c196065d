"""Miss model: exact LRU over a synthetic top-k locality trace, per layer.

Why simulate instead of a closed form: the paper's numbers come from exact LRU, and top-k sets are
not independent references (an entry selected now is likely selected next step), which breaks the
usual Che/IRM approximations. The simulation is cheap because it runs at a reduced scale: context,
top-k and hot-buffer slots are all divided by `lru_sim_scale` (ratios unchanged) and the miss counts
multiplied back. Results are cached per (similarity, sizes, MTP, warmup).

Locality model of one layer (all constants in data/constants.json, kind prior):
- each step keeps every entry of the previous top-k set with probability s, the layer's intra-layer
  similarity (ESS.md section 3: ~0.7-0.9 in layers 1-17 and 48-60, 0.3-0.6 in 18-44, ~0 in layer 0);
- each replaced entry is, with probability `reuse_fraction`, one that was in a top-k set during the
  last `reuse_window_steps` steps, else a fresh position drawn uniformly over the history.
A decode step with MTP verifies `mtp` tokens: it accesses `mtp` consecutive top-k sets at once; its
misses are the union's entries not resident before the step. LRU capacity is ratio x context slots.
The buffer starts with the most recent ratio x context positions (what prefill left on the GPU);
warmup on additionally inserts the top-k sets of the last 32 prefill positions before decode.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .constants import const

WARMUP_PREFILL_POSITIONS = 32


@dataclass(frozen=True)
class LayerMisses:
    steady_misses: float      # mean misses per request per step after the first step
    first_step_misses: float  # misses of the first decode step (cold-start burst without warmup)
    union_entries: float      # mean distinct top-k entries a step touches (k x MTP overlap)


def layer_similarity(num_layers: int) -> np.ndarray:
    """Per-layer similarity from the anchor points in data/constants.json, linearly interpolated.

    Index num_layers and beyond (the MTP layer) reuse the last decoder layer's value.
    """
    anchors = np.asarray(const("layer_similarity_anchors"), dtype=float)
    layers = np.arange(num_layers + 1)
    sim = np.interp(layers, anchors[:, 0], anchors[:, 1])
    sim[num_layers] = sim[num_layers - 1]
    return sim


def _top_c_mask(last_access: np.ndarray, capacity: int) -> np.ndarray:
    """Resident set of an exact LRU of `capacity` slots: the `capacity` most recently used positions."""
    used = last_access >= 0
    if used.sum() <= capacity:
        return used
    thresh = np.partition(last_access, last_access.size - capacity)[last_access.size - capacity]
    return last_access >= thresh


class _Trace:
    def __init__(self, rng: np.random.Generator, ctx: int, k: int, sim: float):
        self.rng, self.ctx, self.k, self.sim = rng, ctx, k, sim
        self.reuse_p = const("reuse_fraction")
        self.window = int(const("reuse_window_steps"))
        self.cur = rng.choice(ctx, size=k, replace=False)
        self.recent: list[np.ndarray] = [self.cur]

    def _fresh(self, taken: np.ndarray, n: int) -> np.ndarray:
        """n distinct uniform positions not in `taken` (rejection sampling; top-k << context)."""
        out = np.empty(0, dtype=np.int64)
        while out.size < n:
            cand = self.rng.integers(0, self.ctx, size=2 * (n - out.size) + 8)
            cand = cand[~taken[cand]]
            _, first = np.unique(cand, return_index=True)
            cand = cand[np.sort(first)][: n - out.size]
            taken[cand] = True
            out = np.concatenate([out, cand])
        return out

    def step(self) -> np.ndarray:
        rng = self.rng
        kept = self.cur[rng.random(self.k) < self.sim]
        n_new = self.k - kept.size
        in_set = np.zeros(self.ctx, dtype=bool)
        in_set[kept] = True
        n_reuse = rng.binomial(n_new, self.reuse_p)
        pool = np.unique(np.concatenate(self.recent))
        pool = pool[~in_set[pool]]
        reuse = pool[rng.permutation(pool.size)[:n_reuse]]
        in_set[reuse] = True
        fresh = self._fresh(in_set, n_new - reuse.size)
        self.cur = np.concatenate([kept, reuse, fresh])
        self.recent.append(self.cur)
        if len(self.recent) > self.window:
            self.recent.pop(0)
        return self.cur


@lru_cache(maxsize=4096)
def _simulate(sim: float, ctx: int, k: int, capacity: int, mtp: int, warmup: bool, steps: int) -> LayerMisses:
    rng = np.random.default_rng(abs(hash((round(sim, 3), ctx, k, capacity, mtp, warmup))) % 2**32)
    trace = _Trace(rng, ctx, k, sim)
    last = np.full(ctx, -1, dtype=np.int64)
    clock = 0

    def touch(ids: np.ndarray) -> None:
        nonlocal clock
        last[rng.permutation(ids)] = clock + np.arange(ids.size)
        clock += ids.size

    prefill = [trace.step() for _ in range(WARMUP_PREFILL_POSITIONS)]
    touch(np.arange(ctx - capacity, ctx))          # the newest positions prefill left on the GPU
    if warmup:
        for ids in prefill:                        # then the warmup inserts the prefill's top-k ids
            touch(ids)
    misses, unions = [], []
    for _ in range(steps):
        union = np.unique(np.concatenate([trace.step() for _ in range(mtp)]))
        resident = _top_c_mask(last, capacity)
        misses.append(int((~resident[union]).sum()))
        unions.append(union.size)
        touch(union)
    m = np.asarray(misses, dtype=float)
    return LayerMisses(float(m[1:].mean()), float(m[0]), float(np.mean(unions)))


def layer_misses(similarity: float, context_tokens: int, topk_tokens: int, ratio: float, mtp: int,
                 warmup: bool) -> LayerMisses:
    """Misses per request per step for one layer at full scale (0 when ratio == 1: nothing offloaded)."""
    if ratio >= 1.0:
        return LayerMisses(0.0, 0.0, float(topk_tokens))
    scale = int(const("lru_sim_scale"))
    ctx = max(1, math.ceil(context_tokens / scale))
    k = max(1, min(ctx, topk_tokens // scale))
    cap = max(k, min(ctx, round(ratio * context_tokens / scale)))
    if cap >= ctx:
        return LayerMisses(0.0, 0.0, float(min(topk_tokens, context_tokens)))
    sim_q = round(similarity * 20) / 20        # 0.05 buckets share one cached simulation
    r = _simulate(sim_q, ctx, k, cap, mtp, warmup, int(const("lru_sim_steps")))
    return LayerMisses(r.steady_misses * scale, r.first_step_misses * scale, r.union_entries * scale)


def misses_per_layer(num_cached_layers: int, context_tokens: int, topk_tokens: int, ratio: float,
                     mtp: int, warmup: bool, decode_steps: float, hit_rate: float | None = None) -> np.ndarray:
    """Mean misses per request per step for every cached layer, cold-start burst amortized over the
    request's decode steps. `hit_rate` overrides the model: misses = (1 - hit_rate) x union entries."""
    sims = layer_similarity(num_cached_layers - 1)
    out = np.empty(num_cached_layers)
    for layer in range(num_cached_layers):
        lm = layer_misses(float(sims[layer]), context_tokens, topk_tokens, ratio, mtp, warmup)
        if hit_rate is not None:
            out[layer] = 0.0 if ratio >= 1.0 else (1.0 - hit_rate) * lm.union_entries
        else:
            out[layer] = lm.steady_misses + (lm.first_step_misses - lm.steady_misses) / max(decode_steps, 1.0)
    return out
