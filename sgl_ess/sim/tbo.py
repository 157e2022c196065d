"""Two-Batch Overlap as SGLang 0.5.23 runs it in decode: a stage schedule, not max(compute, comm).

SGLang splits each MoE layer of each micro-batch into five stages at its yield points
(`batch_overlap/operations_strategy.py`, `_compute_moe_deepseek_blog_decode`) and runs micro-batch B
`tbo_delta_stages` = 2 stages behind A, alternating A, B, A, B on one GPU stream
(`operations.py`, `execute_overlapped_operations`):
  T0  the previous layer's output, then the attention's prepare: input projections, indexer, q_b/RoPE
  T1  the attention core (sparse MLA, w_uv, o_proj), the router
  T2  dispatch_a (the DeepEP send is issued here), the shared expert
  T3  dispatch_b (waits until the dispatch has arrived), the routed experts, combine_a (send)
  T4  combine_b (waits until the combine has arrived)
So a dispatch has B's T0 and A's own T2 to hide behind, a combine only the other micro-batch's T1;
whatever is left waits on the GPU stream. The all-to-alls of both micro-batches share one NIC and run
one at a time. Dense layers and the MTP layer do not use TBO in SGLang (`first_k_dense_replace`,
`deepseek_nextn.py`): they run the whole batch with blocking communication.

ESS adds a third resource, the host->GPU link (one per GPU, shared by both micro-batches): a layer's
miss fetch is sent in chunks from points inside T0 (after the indexer, or after each half of it for
DBA) and awaited at one point (before pre-attention for none, before Attn1 inside T1 for DA/DBA). In
between run the micro-batch's own pre-attention and Attn0 and, under TBO, the other micro-batch's T3
(its routed experts): ESS.md's "the fetch of one micro-batch can hide behind the other's compute".
"""
from __future__ import annotations

from dataclasses import dataclass

STAGES = 5
DELTA_STAGES = 2        # SGLang's tbo_delta_stages for DeepSeek decode
DISPATCH_ISSUE, DISPATCH_WAIT, COMBINE_ISSUE, COMBINE_WAIT = 2, 3, 3, 4

_T1_OPS = ("moe.router", "moe.route")


def stage_of(op_name: str, phase: str) -> int:
    """Which stage of the decode strategy an op of ops.py runs in (comm ops are not staged)."""
    if op_name == "moe.add":
        return 0                       # op_output of the previous layer opens the next T0
    if phase in ("attn_in", "indexer", "pre_attn"):
        return 0
    if phase in ("attention", "post_attn") or op_name in _T1_OPS:
        return 1
    if op_name.startswith("moe.experts"):
        return 3
    if phase == "ffn":
        return 2                       # shared expert (MoE layers), or a dense FFN
    raise ValueError(f"op {op_name!r} (phase {phase!r}) has no TBO stage")


@dataclass(frozen=True)
class Fetch:
    """One layer's ESS miss fetch for one micro-batch."""
    chunks: tuple[tuple[float, float], ...]   # (offset into T0 where it is sent, us on the host->GPU link)
    wait_stage: int                           # 0: before pre-attention (none); 1: before Attn1 (DA, DBA)
    wait_offset_us: float                     # where in that stage the GPU waits for every chunk


@dataclass(frozen=True)
class LayerStages:
    """One layer of one micro-batch: GPU time per stage, its two all-to-alls and its miss fetch."""
    compute_us: tuple[float, float, float, float, float]
    dispatch_us: float = 0.0
    combine_us: float = 0.0
    fetch: Fetch | None = None

    def __post_init__(self):
        if len(self.compute_us) != STAGES or min(self.compute_us) < 0 or min(self.dispatch_us, self.combine_us) < 0:
            raise ValueError(f"LayerStages: expected {STAGES} non-negative stage times and non-negative comm, "
                             f"got {self.compute_us}, {self.dispatch_us}, {self.combine_us}")
        f = self.fetch
        if f is not None and (f.wait_stage not in (0, 1) or f.wait_offset_us < 0
                              or any(off < 0 or dur < 0 or off > self.compute_us[0] for off, dur in f.chunks)):
            raise ValueError(f"LayerStages: fetch {f} must send its chunks inside T0 (0..{self.compute_us[0]} us) "
                             f"and wait in T0 or T1 at a non-negative offset")

    @property
    def compute_total_us(self) -> float:
        return sum(self.compute_us)


@dataclass(frozen=True)
class Schedule:
    total_us: float
    fetch_wait_us: float      # GPU time spent waiting for miss fetches
    comm_wait_us: float       # GPU time spent waiting for (or, without TBO, blocked on) all-to-alls


def executor_order(n_stages: int, delta: int = DELTA_STAGES) -> list[tuple[int, int]]:
    """(micro-batch, stage index) in the order SGLang's executor runs them: A goes `delta` stages ahead."""
    order = [(0, k) for k in range(min(delta, n_stages))]
    for k in range(n_stages - delta):
        order += [(0, k + delta), (1, k)]
    order += [(1, k) for k in range(max(0, n_stages - delta), n_stages)]
    return order


def _run(mbs: tuple[list[LayerStages], ...], order: list[tuple[int, int]], blocking: bool) -> Schedule:
    gpu = nic = link = 0.0
    fetch_wait = comm_wait = 0.0
    arrive = [[0.0, 0.0] for _ in mbs]         # per micro-batch: dispatch, combine arrival of its current layer
    fetched = [0.0 for _ in mbs]               # per micro-batch: when its current layer's misses are all in
    for mb, k in order:
        layer, stage = mbs[mb][k // STAGES], k % STAGES
        start = gpu
        if blocking and stage == DISPATCH_ISSUE:
            start += layer.dispatch_us
            comm_wait += layer.dispatch_us
        if not blocking and stage == DISPATCH_WAIT and arrive[mb][0] > start:
            comm_wait += arrive[mb][0] - start
            start = arrive[mb][0]
        if not blocking and stage == COMBINE_WAIT and arrive[mb][1] > start:
            comm_wait += arrive[mb][1] - start
            start = arrive[mb][1]
        if not blocking and stage == DISPATCH_ISSUE and layer.dispatch_us > 0:
            nic = max(nic, start) + layer.dispatch_us
            arrive[mb][0] = nic
        compute, f = layer.compute_us[stage], layer.fetch
        if f is not None and stage == 0:
            for off, dur in f.chunks:
                link = max(link, start + off) + dur
            fetched[mb] = link
        if f is not None and stage == f.wait_stage:
            at = start + min(f.wait_offset_us, compute)
            waited = max(0.0, fetched[mb] - at)
            fetch_wait += waited
            start += waited
        gpu = start + compute
        if stage == COMBINE_ISSUE and layer.combine_us > 0:
            if blocking:
                gpu += layer.combine_us
                comm_wait += layer.combine_us
            else:
                nic = max(nic, gpu) + layer.combine_us
                arrive[mb][1] = nic
    return Schedule(gpu, fetch_wait, comm_wait)


def serial(layers: list[LayerStages]) -> Schedule:
    """One micro-batch (TBO off, dense layers, the MTP layer): every all-to-all blocks the stream."""
    return _run((layers,), [(0, k) for k in range(STAGES * len(layers))], blocking=True)


def tbo(a: list[LayerStages], b: list[LayerStages], delta: int = DELTA_STAGES) -> Schedule:
    """Micro-batches A (`a`) and B (`b`) under the stage schedule above."""
    if len(a) != len(b):
        raise ValueError(f"tbo: micro-batches with {len(a)} and {len(b)} layers; expected the same")
    return _run((a, b), executor_order(STAGES * len(a), delta), blocking=False)
