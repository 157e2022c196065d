"""Memory model: weight bytes per GPU, cache bytes per request (GPU and host), largest batch that fits.

Placement under DP attention + EP (paper Table 1): attention, dense-FFN, shared-expert, embedding and
LM-head weights are replicated on every GPU; routed experts are sharded over `ep` GPUs. Every cached
layer (61 decoder layers + the MTP layer) keeps on GPU the full indexer keys (on the layers that have an
indexer); without offload the full latent cache, with ESS a hot latent buffer of `ratio x context` slots
and the full latent history in pinned host memory. With ESS the target model's layers are the ESS store's
whole device allocation for the batch (store_device.py: hot buffers, staging rings, MTP scratch rows, LRU
tables, token map, counters: the bytes --ess-explain prints for the plan's flags); the MTP layer's hot
buffer (its draft store) is counted as hot slots alone.
FP8 block scales (4 B per 128x128 block) are below 0.03% of the weights and are ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from .config import DeploymentConfig, OffloadConfig, ModelSpec, SimConfigError, WorkloadConfig
from .constants import const
from .hardware import HardwareProfile
from .store_device import model_store_allocation

FP8_BYTES = 1
BF16_BYTES = 2


def attention_params_per_layer(m: ModelSpec) -> int:
    """MLA projections + lightning indexer projections of one layer."""
    qk_head = m.qk_nope_dim + m.qk_rope_dim
    return (m.hidden * m.q_lora_rank                                   # q_a_proj
            + m.q_lora_rank * m.heads * qk_head                          # q_b_proj
            + m.hidden * (m.kv_lora_rank + m.qk_rope_dim)                # kv_a_proj_with_mqa
            + m.kv_lora_rank * m.heads * (m.qk_nope_dim + m.v_head_dim)  # kv_b_proj (W_UK, W_UV)
            + m.heads * m.v_head_dim * m.hidden                          # o_proj
            + m.q_lora_rank * m.index_heads * m.index_head_dim           # indexer wq_b
            + m.hidden * m.index_head_dim                                # indexer wk
            + m.hidden * m.index_heads)                                  # indexer weights_proj


def expert_params(m: ModelSpec) -> int:
    """One routed or shared expert: gate, up and down projections."""
    return 3 * m.hidden * m.moe_intermediate


@dataclass(frozen=True)
class WeightBytes:
    replicated_bytes: float
    routed_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.replicated_bytes + self.routed_bytes


def weight_bytes_per_gpu(m: ModelSpec, deploy: DeploymentConfig) -> WeightBytes:
    mtp_moe = 0 if m.mtp_dense_ffn else m.num_mtp_layers
    moe_layers = m.num_layers - m.num_dense_layers + mtp_moe
    dense_mlps = (m.num_dense_layers + (m.num_mtp_layers - mtp_moe)
                  + (m.num_layers - m.num_dense_layers) * m.dense_mlps_per_layer)
    replicated = (m.cached_layers * attention_params_per_layer(m) * FP8_BYTES
                  + dense_mlps * 3 * m.hidden * m.dense_intermediate * FP8_BYTES
                  + moe_layers * m.shared_experts * expert_params(m) * FP8_BYTES
                  + moe_layers * m.hidden * m.routed_experts * BF16_BYTES          # router
                  + m.num_mtp_layers * 2 * m.hidden * m.hidden * FP8_BYTES          # MTP eh_proj
                  + 2 * m.vocab * m.hidden * BF16_BYTES)                            # embedding + head
    local_experts = math.ceil(m.routed_experts / deploy.ep)
    routed = moe_layers * local_experts * expert_params(m) * FP8_BYTES
    return WeightBytes(float(replicated), float(routed))


def hot_slots_per_layer(work: WorkloadConfig, ess: OffloadConfig) -> int:
    """GPU latent slots per request per layer."""
    return math.ceil(ess.ratio * work.context_tokens)


def gpu_bytes_per_request(m: ModelSpec, work: WorkloadConfig, ess: OffloadConfig) -> float:
    """Indexer keys for the full context on the layers that keep them (every cached layer for V3.2, the
    anchors for GLM-5.2) + the hot latent buffer on every cached layer."""
    idx = work.context_tokens * m.indexer_bytes_per_token_layer * m.index_layers
    return float(idx + hot_slots_per_layer(work, ess) * m.latent_bytes_per_token_layer * m.cached_layers)


def ess_store_bytes(m: ModelSpec, work: WorkloadConfig, ess: OffloadConfig, batch: int) -> int:
    """The target model's ESS store on one GPU for `batch` requests, all tensors (store_device.py)."""
    return sum(model_store_allocation(m, batch, ess.ratio, work.context_tokens, work.mtp).values())


def gpu_cache_bytes(m: ModelSpec, work: WorkloadConfig, ess: OffloadConfig, batch: int) -> float:
    """GPU bytes of `batch` requests' caches: without offload batch x gpu_bytes_per_request; with ESS the
    indexer keys and the MTP layer's hot buffer per request plus the target model's ESS store."""
    if not ess.offload or m.dense_attention:
        return batch * gpu_bytes_per_request(m, work, ess)
    idx = work.context_tokens * m.indexer_bytes_per_token_layer * m.index_layers
    draft = hot_slots_per_layer(work, ess) * m.latent_bytes_per_token_layer * m.num_mtp_layers
    return float(batch * (idx + draft) + ess_store_bytes(m, work, ess, batch))


def host_bytes_per_request(m: ModelSpec, work: WorkloadConfig, ess: OffloadConfig) -> float:
    """The full latent history in pinned host memory; zero without offload."""
    if not ess.offload:
        return 0.0
    return float(work.context_tokens * m.latent_bytes_per_token_layer * m.cached_layers)


@dataclass(frozen=True)
class MemoryReport:
    capacity_bytes: float
    weights_bytes: float
    reserve_bytes: float
    cache_budget_bytes: float
    gpu_bytes_per_request: float
    host_bytes_per_request: float
    max_batch: int                    # the smaller of the two limits below
    max_batch_gpu: int = 0            # largest batch the GPU's cache budget holds
    max_batch_host: int | None = None  # largest batch --host-mem-gb holds (None: no host limit given)
    # batch -> GPU cache bytes (gpu_cache_bytes); None: batch x gpu_bytes_per_request
    cache_bytes: Callable[[int], float] | None = field(default=None, repr=False, compare=False)

    def gpu_used_bytes(self, batch: int) -> float:
        cache = self.cache_bytes(batch) if self.cache_bytes else batch * self.gpu_bytes_per_request
        return self.weights_bytes + self.reserve_bytes + cache


def memory_report(m: ModelSpec, hw: HardwareProfile, deploy: DeploymentConfig,
                  work: WorkloadConfig, ess: OffloadConfig) -> MemoryReport:
    capacity = deploy.gpu_mem_gb * 1e9 if deploy.gpu_mem_gb is not None else hw.memory_bytes
    weights = weight_bytes_per_gpu(m, deploy).total_bytes
    reserve = const("non_cache_reserve_GB") * 1e9
    budget = capacity - weights - reserve
    per_req = gpu_bytes_per_request(m, work, ess)
    gpu_max = max(0, math.floor(budget / per_req)) if budget > 0 else 0
    cache = None
    if ess.offload and not m.dense_attention:
        cache = lambda b: gpu_cache_bytes(m, work, ess, b)      # noqa: E731
        gpu_max = _largest_within(cache, budget, gpu_max)
        per_req = cache(max(1, work.batch)) / max(1, work.batch)   # at the batch asked, for messages
    host_req = host_bytes_per_request(m, work, ess)
    host_max = None
    if deploy.host_mem_gb is not None and host_req > 0:
        host_max = math.floor(deploy.host_mem_gb * 1e9 / (host_req * deploy.gpus_per_node))
    max_batch = gpu_max if host_max is None else min(gpu_max, host_max)
    return MemoryReport(capacity, weights, reserve, budget, per_req, host_req, max_batch, gpu_max, host_max, cache)


def _largest_within(cache: Callable[[int], float], budget: float, hi: int) -> int:
    """The largest batch b <= hi with cache(b) <= budget (cache grows with b); 0 if none."""
    lo = 0
    if budget <= 0 or cache(0) > budget:
        return 0
    while lo < hi:                                  # invariant: cache(lo) <= budget
        mid = (lo + hi + 1) // 2
        if cache(mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def check_fits(rep: MemoryReport, work: WorkloadConfig, ess: OffloadConfig, hw_name: str) -> None:
    """Raise a SimConfigError that names the largest batch that fits and the flags that change it."""
    if rep.cache_budget_bytes <= 0:
        raise SimConfigError(
            f"weights {rep.weights_bytes / 1e9:.1f} GB + reserve {rep.reserve_bytes / 1e9:.1f} GB exceed the "
            f"{rep.capacity_bytes / 1e9:.0f} GB of a {hw_name} GPU: no cache fits; use a larger GPU "
            f"(--hardware, --gpu-mem-gb) or more expert parallelism (--ep)")
    if work.batch > rep.max_batch:
        raise SimConfigError(
            f"batch = {work.batch} does not fit: at context {work.context_tokens} and ratio {ess.ratio} a "
            f"request needs {rep.gpu_bytes_per_request / 1e9:.3f} GB on GPU"
            + (f" and {rep.host_bytes_per_request / 1e9:.3f} GB on host" if rep.host_bytes_per_request else "")
            + f"; the largest batch that fits is {rep.max_batch}; lower --batch, lower --ratio, shorten "
              f"--context, or raise --gpu-mem-gb/--host-mem-gb")
