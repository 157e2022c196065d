"""Host memory per node for an SGLang serving layout: ranks and ESS host pools per node, bytes per pool,
shared and per rank, and whether --host-mem-gb holds them (`plan`'s last section).

The counting rule is sgl_ess.core.parallel_layout, the same one the launcher's startup report and
host-memory check use; so is the pool size, (tokens + one 64-token page) x layers x row bytes, where
layers are the model's decoder layers (num_hidden_layers: what the launcher's host pool allocates;
an MTP draft keeps its own store, not counted here). Nothing here holds memory; results are frozen.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..core.parallel_layout import ParallelLayout, host_pool_bytes
from .config import DeploymentConfig, ModelSpec, ServingLayoutConfig, SimConfigError

PAGE_TOKENS = 64          # SGLang's DSA pools use 64-token pages (sgl_ess/serving/preflight.py DSA_PAGE_SIZE)
SHARINGS = ("shared", "per-rank")


def latent_row_bytes(m: ModelSpec, kv_cache_dtype: str) -> int:
    """Bytes of one token's latent row in the host pool: the model's device row for fp8_e4m3 (FlashMLA's
    656 B row for DeepSeek-V3.2), (kv_lora_rank + rope) x 2 B for bf16 (the CPU serving path)."""
    if kv_cache_dtype == "bf16":
        return (m.kv_lora_rank + m.qk_rope_dim) * 2
    return m.latent_bytes_per_token_layer


def resolve_layout(serving: ServingLayoutConfig, deploy: DeploymentConfig) -> ParallelLayout:
    """The layout with its defaults filled in (see ServingLayoutConfig); raises SimConfigError if impossible."""
    plain = serving.tp is None and serving.dp is None and serving.attn_dp_size is None
    dp_attention = plain if serving.enable_dp_attention is None else serving.enable_dp_attention
    tp = deploy.gpus if serving.tp is None else serving.tp
    dp = serving.dp if serving.dp is not None else (tp if dp_attention else 1)
    lay, problems = ParallelLayout.from_sglang(tp=tp, dp=dp, nnodes=deploy.nodes if serving.nnodes is None
                                               else serving.nnodes, dp_attention=dp_attention,
                                               attn_dp_size=serving.attn_dp_size or 1)
    if problems:
        raise SimConfigError("; ".join(problems))
    if lay.ranks_per_node > deploy.gpus_per_node:
        raise SimConfigError(f"--tp {lay.tp} --dp {lay.dp} --nnodes {lay.nnodes}: {lay.ranks_per_node} ranks per "
                             f"node, expected at most --gpus-per-node {deploy.gpus_per_node}; raise --nnodes or "
                             f"--gpus-per-node")
    return lay


@dataclass(frozen=True)
class NodePools:
    """One node's host pools under one sharing choice."""
    sharing: str                   # "shared" | "per-rank"
    ranks_per_node: int
    pools_per_node: int
    bytes_per_pool: int
    host_bytes_per_node: int
    fits: bool | None              # within --host-mem-gb; None when no host memory was given


def node_pools(lay: ParallelLayout, sharing: str, tokens: int, layers: int, row_bytes: int,
               host_mem_gb: float | None = None) -> NodePools:
    pools = lay.pools_per_node(shared=sharing == "shared")
    per_pool = host_pool_bytes(tokens, PAGE_TOKENS, layers, row_bytes)
    fits = None if host_mem_gb is None else pools * per_pool <= host_mem_gb * 1e9
    return NodePools(sharing, lay.ranks_per_node, pools, per_pool, pools * per_pool, fits)


@dataclass(frozen=True)
class HostPoolReport:
    layout: ParallelLayout
    tokens_per_pool: int
    tokens_source: str
    layers: int
    row_bytes: int
    kv_cache_dtype: str
    chosen: str                    # the sharing --share-host-pool picks
    host_mem_gb: float | None
    by_sharing: tuple[NodePools, ...]

    def for_sharing(self, sharing: str) -> NodePools:
        return next(p for p in self.by_sharing if p.sharing == sharing)

    def as_dict(self) -> dict:
        return {"layout": asdict(self.layout), "attention_tp": self.layout.attention_tp,
                "tokens_per_pool": self.tokens_per_pool, "tokens_source": self.tokens_source,
                "layers": self.layers, "row_bytes": self.row_bytes, "kv_cache_dtype": self.kv_cache_dtype,
                "page_tokens": PAGE_TOKENS, "chosen": self.chosen, "host_mem_gb_per_node": self.host_mem_gb,
                "by_sharing": {p.sharing: asdict(p) for p in self.by_sharing}}


def host_pool_report(serving: ServingLayoutConfig, deploy: DeploymentConfig, tokens: int,
                     tokens_source: str) -> HostPoolReport:
    m = ModelSpec.load(deploy.model)
    lay = resolve_layout(serving, deploy)
    row = latent_row_bytes(m, serving.kv_cache_dtype)
    # auto: what the launcher's --ess-share-host-pool auto does on a CUDA node (one pool per rank)
    chosen = "per-rank" if serving.share_host_pool == "auto" else serving.share_host_pool
    layers = m.num_layers * m.attention_sublayers       # SGLang's num_attention_layers: the host pool's layers
    rows = tuple(node_pools(lay, s, tokens, layers, row, deploy.host_mem_gb) for s in SHARINGS)
    return HostPoolReport(lay, tokens, tokens_source, layers, row, serving.kv_cache_dtype, chosen,
                          deploy.host_mem_gb, rows)


def _gb(nbytes: float) -> str:
    gb = nbytes / 1e9
    return f"{gb:.1f}" if gb >= 10 else f"{gb:.3f}"


def report_lines(rep: HostPoolReport, share_flag: str) -> list[str]:
    lay = rep.layout
    fits_head = "fits" if rep.host_mem_gb is None else f"fits {rep.host_mem_gb:g} GB"
    out = [f"host pools per node: --tp {lay.tp} --dp {lay.dp}{' --enable-dp-attention' if lay.dp_attention else ''}"
           f" --nnodes {lay.nnodes} (attention TP {lay.attention_tp}); {rep.tokens_per_pool} tokens per pool "
           f"({rep.tokens_source}) + one {PAGE_TOKENS}-token page, {rep.layers} layers x {rep.row_bytes} B rows "
           f"({rep.kv_cache_dtype})",
           f"  {'sharing':<8} {'ranks/node':>10} {'pools/node':>10} {'GB/pool':>9} {'GB/node':>9} {fits_head:>12}"]
    for p in rep.by_sharing:
        fits = "-" if p.fits is None else ("yes" if p.fits else "NO")
        mark = f"  <- --share-host-pool {share_flag}" if p.sharing == rep.chosen else ""
        out.append(f"  {p.sharing:<8} {p.ranks_per_node:>10} {p.pools_per_node:>10} {_gb(p.bytes_per_pool):>9} "
                   f"{_gb(p.host_bytes_per_node):>9} {fits:>12}{mark}")
    out.append("  shared: one pool per attention-TP group on a node, its ranks map it (the CPU serving path); "
               "per-rank: every rank its own copy (CUDA today)")
    if rep.host_mem_gb is None:
        out.append("  no --host-mem-gb given: the fit is not checked")
    return out
