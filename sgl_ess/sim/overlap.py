"""Overlap accounting: how much of a layer's ESS transfer each strategy hides behind compute.

Inputs are one micro-batch's phase times in one layer. Timeline per strategy (ESS.md section 3):
- none: indexer -> fetch misses -> pre-attn -> attention; fetch and write-back fully exposed.
- da:   indexer -> [fetch || pre-attn + Attn0 over the hits] -> Attn1 over the misses -> merge;
        write-back overlaps Attn1 + post-attn.
- dba:  as da, and the indexer is split in two batch halves: fetch(half 0) overlaps indexer(half 1),
        fetch(half 1) follows on the link; Attn1 waits for both.
- full: per layer, the cheaper of da and dba (the paper's offline per-layer choice).
Exposed time adds to the micro-batch's compute path; with Two-Batch Overlap, step.py lets the
other micro-batch's communication slack absorb it.
"""
from __future__ import annotations

from dataclasses import dataclass

from .constants import const


@dataclass(frozen=True)
class LayerPhaseTimes:
    indexer_us: float
    pre_attn_us: float
    attention_us: float
    post_attn_us: float
    fetch_us: float
    writeback_us: float
    miss_fraction: float   # misses / entries attention reads; Attn1's share of the attention work


@dataclass(frozen=True)
class OverlapResult:
    strategy: str          # the strategy actually used (full resolves to da or dba)
    exposed_us: float      # transfer time left on the critical path
    extra_us: float        # compute added by the strategy itself (split launches, LSE merge)

    @property
    def cost_us(self) -> float:
        return self.exposed_us + self.extra_us


def _writeback_exposed(t: LayerPhaseTimes) -> float:
    return max(0.0, t.writeback_us - (t.attention_us * t.miss_fraction + t.post_attn_us))


def overlap_none(t: LayerPhaseTimes) -> OverlapResult:
    return OverlapResult("none", t.fetch_us + t.writeback_us, 0.0)


def overlap_da(t: LayerPhaseTimes) -> OverlapResult:
    window = t.pre_attn_us + t.attention_us * (1.0 - t.miss_fraction)
    return OverlapResult("da", max(0.0, t.fetch_us - window) + _writeback_exposed(t), const("da_merge_us"))


def overlap_dba(t: LayerPhaseTimes) -> OverlapResult:
    half_idx, half_fetch = t.indexer_us / 2, t.fetch_us / 2
    fetch0_end = half_idx + half_fetch                   # starts when indexer half 0 ends
    fetch1_end = max(t.indexer_us, fetch0_end) + half_fetch
    attn1_ready = t.indexer_us + t.pre_attn_us + t.attention_us * (1.0 - t.miss_fraction)
    exposed = max(0.0, fetch1_end - attn1_ready) + _writeback_exposed(t)
    return OverlapResult("dba", exposed, const("da_merge_us") + const("dba_split_us"))


def overlap(strategy: str, t: LayerPhaseTimes) -> OverlapResult:
    """Account one layer of one micro-batch; no transfer means nothing to hide and no split cost."""
    if t.fetch_us == 0.0 and t.writeback_us == 0.0:
        return OverlapResult(strategy if strategy != "full" else "da", 0.0, 0.0)
    if strategy == "none":
        return overlap_none(t)
    if strategy == "da":
        return overlap_da(t)
    if strategy == "dba":
        return overlap_dba(t)
    if strategy == "full":
        return min(overlap_da(t), overlap_dba(t), key=lambda r: r.cost_us)
    raise ValueError(f"overlap strategy {strategy!r}: expected none, da, dba or full (--overlap)")
