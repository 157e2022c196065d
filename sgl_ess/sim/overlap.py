"""Overlap accounting: how much of a layer's ESS transfer each strategy hides behind compute.

Inputs are one micro-batch's phase times in one layer; every strategy starts with the layer's input
projections (attn_in: what the indexer reads). Timeline per strategy (ESS.md section 3):
- none: indexer -> fetch misses -> pre-attn -> attention; fetch and write-back fully exposed.
- da:   indexer -> [fetch || pre-attn + Attn0 over the hits] -> Attn1 over the misses -> merge;
        write-back overlaps Attn1 + post-attn. Costs DA_EXTRA_KERNELS more launches.
- dba:  as da, and the indexer is split in two batch halves: fetch(half 0) overlaps indexer(half 1),
        fetch(half 1) follows on the link; Attn1 waits for both. Costs DBA_EXTRA_KERNELS more launches.
- full: per layer, the cheaper of da and dba (the paper's offline per-layer choice).
The split strategies cost nothing but extra kernel launches (the attention and indexer work is the
same, only cut in two); step.py prices each launch at kernel_overhead_us. This module accounts one
micro-batch alone (section 3's case, and the per-layer choice of "full"); in a step, step.py hands the
fetch to the stage schedule (tbo.py), where the other micro-batch's stages can hide it as well.
"""
from __future__ import annotations

from dataclasses import dataclass

DA_EXTRA_KERNELS = 3    # Attn1 is a second sparse-attention launch (main + split-KV combine) + the LSE merge
DBA_EXTRA_KERNELS = 6   # DA's 3 + the indexer's second half (logits metadata + logits + top-k)


@dataclass(frozen=True)
class LayerPhaseTimes:
    indexer_us: float      # indexer, top-k and the hit/miss resolve: DBA splits this part in two
    pre_attn_us: float
    attention_us: float
    post_attn_us: float
    fetch_us: float
    writeback_us: float
    miss_fraction: float   # misses / entries attention reads; Attn1's share of the attention work
    attn_in_us: float = 0.0  # input norm and q_a/kv_a projections, before the indexer (never split)


@dataclass(frozen=True)
class OverlapResult:
    strategy: str          # the strategy actually used (full resolves to da or dba)
    exposed_us: float      # transfer time left on the critical path
    extra_kernels: int     # launches the strategy adds (split attention, merge, split indexer)

    def cost_us(self, kernel_overhead_us: float) -> float:
        return self.exposed_us + self.extra_kernels * kernel_overhead_us


def writeback_exposed(t: LayerPhaseTimes) -> float:
    return max(0.0, t.writeback_us - (t.attention_us * t.miss_fraction + t.post_attn_us))


def overlap_none(t: LayerPhaseTimes) -> OverlapResult:
    return OverlapResult("none", t.fetch_us + t.writeback_us, 0)


def overlap_da(t: LayerPhaseTimes) -> OverlapResult:
    window = t.pre_attn_us + t.attention_us * (1.0 - t.miss_fraction)
    return OverlapResult("da", max(0.0, t.fetch_us - window) + writeback_exposed(t), DA_EXTRA_KERNELS)


def overlap_dba(t: LayerPhaseTimes) -> OverlapResult:
    # time measured from the end of attn_in, which both strategies share
    half_idx, half_fetch = t.indexer_us / 2, t.fetch_us / 2
    fetch0_end = half_idx + half_fetch                   # starts when indexer half 0 ends
    fetch1_end = max(t.indexer_us, fetch0_end) + half_fetch
    attn1_ready = t.indexer_us + t.pre_attn_us + t.attention_us * (1.0 - t.miss_fraction)
    exposed = max(0.0, fetch1_end - attn1_ready) + writeback_exposed(t)
    return OverlapResult("dba", exposed, DBA_EXTRA_KERNELS)


def overlap(strategy: str, t: LayerPhaseTimes, kernel_overhead_us: float = 0.0) -> OverlapResult:
    """Account one layer of one micro-batch; no transfer means nothing to hide and no split cost."""
    if t.fetch_us == 0.0 and t.writeback_us == 0.0:
        return OverlapResult(strategy if strategy != "full" else "da", 0.0, 0)
    if strategy == "none":
        return overlap_none(t)
    if strategy == "da":
        return overlap_da(t)
    if strategy == "dba":
        return overlap_dba(t)
    if strategy == "full":
        return min(overlap_da(t), overlap_dba(t), key=lambda r: r.cost_us(kernel_overhead_us))
    raise ValueError(f"overlap strategy {strategy!r}: expected none, da, dba or full (--overlap)")
