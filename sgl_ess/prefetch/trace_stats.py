"""Statistics measured FROM a top-k trace (numpy + the plain-Python LRU oracle; no torch).

  adjacent_overlap(trace)          per layer: mean |S_t & S_t+1| / k over (request, adjacent plans)
  lru_misses(trace, hot_slots)     per layer: mean exact-LRU misses per request per plan, replaying
                                   open / close / warmup / touch / plan like the store does
Used to check a generator against the statistics it was configured for, and to summarise a
recorded trace.
"""
from __future__ import annotations

import numpy as np

from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.prefetch.trace_format import Trace


def adjacent_overlap(trace: Trace) -> np.ndarray:
    """float [L]: mean raw overlap of adjacent plans of one (request, layer); NaN where none."""
    L = trace.num_layers
    prev: dict[tuple[int, int], np.ndarray] = {}
    total, count = np.zeros(L), np.zeros(L)
    for ev in trace.events:
        if ev["ev"] in ("open", "close"):
            for key in [key for key in prev if key[0] == ev["req"]]:
                del prev[key]
            continue
        if ev["ev"] != "plan":
            continue
        layer = ev["layer"]
        for r, row in zip(ev["reqs"].tolist(), ev["topk"]):
            cur = row[row >= 0]
            old = prev.get((r, layer))
            if old is not None and cur.size:
                total[layer] += np.intersect1d(old, cur, assume_unique=True).size / max(cur.size, old.size)
                count[layer] += 1
            prev[(r, layer)] = cur
    with np.errstate(invalid="ignore"):
        return total / count


def lru_misses(trace: Trace, hot_slots: int | None = None) -> np.ndarray:
    """float [L]: exact-LRU misses per request per plan (N = hot_slots, default the header's).
    Warmup feeds the W sets as one stream, oldest first (the store's warm state, warm_state.py); a
    request whose context fits in N is not modelled (the store's fast path loads it whole)."""
    n = int(hot_slots or trace.header["hot_slots_per_request"])
    L = trace.num_layers
    lru: dict[tuple[int, int], LruOracle] = {}
    misses, plans = np.zeros(L), np.zeros(L)

    def get(r: int, layer: int) -> LruOracle:
        if (r, layer) not in lru:
            lru[(r, layer)] = LruOracle(n)
        return lru[(r, layer)]

    for ev in trace.events:
        kind = ev["ev"]
        if kind in ("open", "close"):
            for key in [key for key in lru if key[0] == ev["req"]]:
                del lru[key]
        elif kind == "warmup":
            for r, sets in zip(ev["reqs"].tolist(), ev["ids"]):
                o = get(r, ev["layer"])
                for t in sets.reshape(-1).tolist():
                    if t >= 0:
                        o.access([t])
        elif kind == "touch":
            for r, pos in zip(ev["reqs"].tolist(), ev["pos"]):
                get(r, ev["layer"]).access(pos.tolist())
        else:
            for r, row in zip(ev["reqs"].tolist(), ev["topk"]):
                misses[ev["layer"]] += len(get(r, ev["layer"]).access(row.tolist()).misses)
                plans[ev["layer"]] += 1
    with np.errstate(invalid="ignore"):
        return misses / plans
