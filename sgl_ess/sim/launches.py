"""Kernel launches per decode step, counted from the model and the deployment, and what each costs.

The count is structure: every op in ops.py declares its kernels; a step runs the embedding, the dense
layers on the whole batch, the MoE layers once per micro-batch (two under TBO), the LM head, and with
MTP n the draft extend (the MTP layer over n tokens) plus n - 2 one-token draft passes, each with its
LM head. Shared-index layers (GLM-5.2) have no indexer kernels. ESS adds its fetch / write-back
kernels and those of the overlap strategy each layer picks (step.py, overlap.py).

The cost is a published figure, not a fit: with CUDA graphs (SGLang's decode default) each kernel adds
the graph-node gap, without them the stream-launch gap (constants.json: graph_node_launch_us,
stream_launch_us, both from NVIDIA's CUDA Graphs blog). What a launch costs beyond that (tails,
waves) is in kernel_time_scale, which multiplies kernel time, not launches.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ModelSpec, SimConfig
from .constants import const
from .ops import embed_op, head_ops, layer_ops, mtp_input_ops


def launch_us(cuda_graph: bool) -> float:
    """Published per-kernel launch gap: CUDA graph node, or back-to-back stream launch."""
    return float(const("graph_node_launch_us" if cuda_graph else "stream_launch_us"))


def _kernels(ops) -> int:
    return sum(op.kernels for op in ops)


def layer_kernels(m: ModelSpec, requests: int, q: int, context: int, dense: bool, ep: int, anchor: bool = True,
                  extra=(), mtp: bool = False) -> int:
    """Kernels one layer launches for one micro-batch (ESS kernels not included)."""
    return _kernels(list(extra) + layer_ops(m, requests, q, context, dense, ep, anchor, mtp))


@dataclass(frozen=True)
class LaunchCount:
    embed: int
    dense_layers: int
    moe_layers: int
    head: int
    mtp_draft: int
    micro_batches: int

    @property
    def total(self) -> int:
        return self.embed + self.dense_layers + self.moe_layers + self.head + self.mtp_draft


def launches_per_step(cfg: SimConfig, m: ModelSpec | None = None) -> LaunchCount:
    """Kernel launches of one decode step without ESS, from the model and the deployment alone."""
    d, w = cfg.deploy, cfg.work
    m = m or ModelSpec.load(d.model)
    b, q, ctx = w.batch, w.mtp, w.context_tokens
    mbs = [b - b // 2, b // 2] if d.tbo and b >= 2 else [b]
    dense = sum(layer_kernels(m, b, q, ctx, True, d.ep, m.is_anchor(i)) for i in range(m.num_dense_layers))
    moe = sum(layer_kernels(m, mb, q, ctx, False, d.ep, m.is_anchor(i))
              for i in range(m.num_dense_layers, m.num_layers) for mb in mbs)
    mtp = 0
    if q > 1:
        mtp = (layer_kernels(m, b, q, ctx, False, d.ep, True, mtp_input_ops(m, b * q), True) + _kernels(head_ops(m, b))
               + (q - 2) * (layer_kernels(m, b, 1, ctx, False, d.ep, True, mtp_input_ops(m, b), True)
                            + _kernels(head_ops(m, b))))
    return LaunchCount(_kernels([embed_op(m, b * q)]), dense, moe, _kernels(head_ops(m, b * q)), mtp, len(mbs))
