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
class LayerStages:
    """One layer of one micro-batch: GPU time per stage and its two all-to-alls."""
    compute_us: tuple[float, float, float, float, float]
    dispatch_us: float = 0.0
    combine_us: float = 0.0

    def __post_init__(self):
        if len(self.compute_us) != STAGES or min(self.compute_us) < 0 or min(self.dispatch_us, self.combine_us) < 0:
            raise ValueError(f"LayerStages: expected {STAGES} non-negative stage times and non-negative comm, "
                             f"got {self.compute_us}, {self.dispatch_us}, {self.combine_us}")

    @property
    def compute_total_us(self) -> float:
        return sum(self.compute_us)


def serial_us(layers: list[LayerStages]) -> float:
    """No overlap: every all-to-all blocks the stream (one micro-batch, or TBO off)."""
    return sum(s.compute_total_us + s.dispatch_us + s.combine_us for s in layers)


def executor_order(n_stages: int, delta: int = DELTA_STAGES) -> list[tuple[int, int]]:
    """(micro-batch, stage index) in the order SGLang's executor runs them: A goes `delta` stages ahead."""
    order = [(0, k) for k in range(min(delta, n_stages))]
    for k in range(n_stages - delta):
        order += [(0, k + delta), (1, k)]
    order += [(1, k) for k in range(max(0, n_stages - delta), n_stages)]
    return order


def tbo_us(a: list[LayerStages], b: list[LayerStages], delta: int = DELTA_STAGES) -> float:
    """Wall time of the layers `a` (micro-batch A) and `b` (B) under the stage schedule above."""
    if len(a) != len(b):
        raise ValueError(f"tbo_us: micro-batches with {len(a)} and {len(b)} layers; expected the same")
    mbs = (a, b)
    gpu = nic = 0.0
    arrive = [[0.0, 0.0], [0.0, 0.0]]          # per micro-batch: dispatch, combine arrival of its current layer
    for mb, k in executor_order(STAGES * len(a), delta):
        layer, stage = mbs[mb][k // STAGES], k % STAGES
        start = gpu
        if stage == DISPATCH_WAIT:
            start = max(start, arrive[mb][0])
        if stage == COMBINE_WAIT:
            start = max(start, arrive[mb][1])
        if stage == DISPATCH_ISSUE and layer.dispatch_us > 0:
            nic = max(nic, start) + layer.dispatch_us
            arrive[mb][0] = nic
        gpu = start + layer.compute_us[stage]
        if stage == COMBINE_ISSUE and layer.combine_us > 0:
            nic = max(nic, gpu) + layer.combine_us
            arrive[mb][1] = nic
    return gpu
