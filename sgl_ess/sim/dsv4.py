"""DeepSeek-V4 capacity model: cache bytes per request on the GPU and the host, resident vs ESS, and the
largest decode batch per GPU each way (`python -m sgl_ess.sim v4`).

V4 is not MLA + DSA, so ModelSpec and the step-time model do not describe it; this file models memory
only. Every layer keeps a sliding window of 128 tokens; a ratio-4 (C4) layer adds one 584-byte compressed
entry per 4 tokens, scored by a C4 indexer (one 132-byte key per entry) that picks 512 entries per token;
a ratio-128 (C128) layer adds one entry per 128 tokens, all read. Each compressed layer also keeps its
compressor's running state per request (a ring of raw rows, fp32).

ESS for V4 (docs/dsv4.md; served on the CPU dsv4 arm, planned on GPUs) moves the C4 entries to pinned
host memory and keeps on the GPU what every step reads whole or what is small: the windows, the C128
entries, the C4 indexer keys, the compressor states, and a hot buffer of C4 entries per request and C4
layer. The ESS store's own rings and LRU tables (store_device.py for the DSA store) are not counted here.
spec_from_config reads the same spec from a model's config.json: the launcher's --ess-explain sizes V4
with it (integration/sglang/launcher/v4_plan.py).

The window is per request, not per token: SGLang keeps paged SWA (256-token pages) and a request's last
128 tokens straddle at most two pages, which this model counts (the worst case).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from .config import V4_NAMES, SimConfigError, load_data
from .constants import const

V4_MODELS = {"deepseek_v4_flash": "model_deepseek_v4_flash.json"}
V4_ALIASES = {name: "deepseek_v4_flash" for name in V4_NAMES}


@dataclass(frozen=True)
class V4Spec:
    name: str
    ratios: tuple[int, ...]          # per layer: 0 window only, 4 or 128
    window_tokens: int
    swa_page_tokens: int
    entry_bytes: int
    topk_entries: int
    index_head_dim: int
    indexer_bytes_per_entry: int
    head_dim: int
    state_bytes_per_value: int
    c4_state_ring: int
    c128_state_ring: int
    total_params: float
    hidden: int
    routed_experts: int
    moe_intermediate: int
    vocab: int
    routed_expert_bits: float
    other_param_bytes: float

    @property
    def c4_layers(self) -> int:
        return sum(1 for r in self.ratios if r == 4)

    @property
    def c128_layers(self) -> int:
        return sum(1 for r in self.ratios if r == 128)

    @classmethod
    def load(cls, name: str = "deepseek_v4_flash") -> "V4Spec":
        key = V4_ALIASES.get(name.lower(), name)
        if key not in V4_MODELS:
            raise SimConfigError(f"V4 model = {name!r}: unknown; expected one of {', '.join(V4_MODELS)}; fix --model")
        return _load(key)


def v4_schedule(layers: int, window_only: list[int]) -> tuple[int, ...]:
    """DeepSeek-V4-Flash's layer schedule: the window-only layers, then even layers ratio 4, odd ratio 128."""
    return tuple(0 if i in window_only else (4 if i % 2 == 0 else 128) for i in range(layers))


@lru_cache(maxsize=None)
def _load(key: str) -> V4Spec:
    d = load_data(V4_MODELS[key])
    return V4Spec(
        name=key, ratios=v4_schedule(d["num_hidden_layers"], d["window_only_layers"]),
        window_tokens=d["window_tokens"], swa_page_tokens=d["swa_page_tokens"], entry_bytes=d["entry_bytes"],
        topk_entries=d["index_topk_entries"], index_head_dim=d["index_head_dim"],
        indexer_bytes_per_entry=d["indexer_bytes_per_entry"], head_dim=d["head_dim"],
        state_bytes_per_value=d["state_bytes_per_value"], c4_state_ring=d["c4_state_ring"],
        c128_state_ring=d["c128_state_ring"], total_params=float(d["total_params"]), hidden=d["hidden_size"],
        routed_experts=d["n_routed_experts"], moe_intermediate=d["moe_intermediate_size"], vocab=d["vocab_size"],
        routed_expert_bits=d["routed_expert_bits"], other_param_bytes=d["other_param_bytes"])


def c4_entries(m: V4Spec, context: int) -> int:
    return context // 4


def hot_entries(m: V4Spec, context: int, ratio: float) -> int:
    """C4 entries an ESS hot buffer holds per request and C4 layer: `ratio` of the request's entries, never
    fewer than one step's top-k (512), never more than it has."""
    n = c4_entries(m, context)
    return min(n, max(m.topk_entries, math.ceil(ratio * n)))


def device_parts(m: V4Spec, context: int) -> dict[str, int]:
    """GPU bytes of one request that stay on the GPU with ESS on or off, by part: the windows (fixed per
    request), the C128 entries, the C4 index keys and the compressor states."""
    window_rows = 2 * m.swa_page_tokens if m.window_tokens <= m.swa_page_tokens else \
        (math.ceil(m.window_tokens / m.swa_page_tokens) + 1) * m.swa_page_tokens
    c4_state = m.c4_state_ring * (2 * 2 * m.head_dim + 2 * 2 * m.index_head_dim) * m.state_bytes_per_value
    c128_state = m.c128_state_ring * 2 * m.head_dim * m.state_bytes_per_value
    return {
        "window": len(m.ratios) * window_rows * m.entry_bytes,
        "c128_entries": m.c128_layers * (context // 128) * m.entry_bytes,
        "c4_index_keys": m.c4_layers * c4_entries(m, context) * m.indexer_bytes_per_entry,
        "compressor_state": m.c4_layers * c4_state + m.c128_layers * c128_state,
    }


def c4_bytes(m: V4Spec, entries: int, entry_bytes: int | None = None) -> int:
    """Bytes of `entries` C4 entries in every C4 layer (a request's entries, or its hot buffer), at
    `entry_bytes` per entry (default: the spec's layout)."""
    return m.c4_layers * entries * (m.entry_bytes if entry_bytes is None else entry_bytes)


def request_parts(m: V4Spec, context: int, ess: bool, ratio: float) -> dict[str, int]:
    """GPU bytes of one request by part (resident: SGLang's pool; ess: the C4 entries on the host, a hot
    buffer of them on the GPU)."""
    parts = device_parts(m, context)
    if ess:
        parts["c4_hot_buffer"] = c4_bytes(m, hot_entries(m, context, ratio))
    else:
        parts["c4_entries"] = c4_bytes(m, c4_entries(m, context))
    return parts


def host_bytes_per_token(m: V4Spec, entry_bytes: int | None = None) -> float:
    """Pinned host bytes per context token with ESS: the C4 entries of every C4 layer, one per 4 tokens, at
    `entry_bytes` per entry (default: the spec's layout)."""
    return c4_bytes(m, 1, entry_bytes) / 4


def weight_bytes_per_gpu(m: V4Spec, ep: int) -> float:
    """Routed experts sharded over `ep` GPUs at their packed width; every other parameter replicated
    (the embedding and head at BF16, the rest at other_param_bytes)."""
    if m.total_params <= 0:
        raise SimConfigError(f"{m.name}: the model's total parameters are not known (a spec read from a "
                             "config.json sizes the cache only); use a model of sim/data (--model)")
    routed = m.routed_experts * len(m.ratios) * 3 * m.hidden * m.moe_intermediate
    embed = 2 * m.vocab * m.hidden
    other = m.total_params - routed - embed
    if other < 0:
        raise SimConfigError(f"{m.name}: routed experts ({routed:.3g}) exceed the model's total parameters "
                             f"({m.total_params:.3g}); fix the model data")
    local = math.ceil(m.routed_experts / ep) / m.routed_experts
    return routed * local * m.routed_expert_bits / 8 + embed * 2 + other * m.other_param_bytes


@dataclass(frozen=True)
class V4Capacity:
    context: int
    ratio: float
    ep: int
    weights_bytes: float
    reserve_bytes: float
    budget_bytes: float
    resident: dict[str, int]
    ess: dict[str, int]
    host_bytes_per_request: float
    batch_resident: int
    batch_ess_gpu: int
    batch_ess_host: int | None

    @property
    def batch_ess(self) -> int:
        return self.batch_ess_gpu if self.batch_ess_host is None else min(self.batch_ess_gpu, self.batch_ess_host)

    @property
    def gain(self) -> float | None:
        return self.batch_ess / self.batch_resident if self.batch_resident else None


def capacity(m: V4Spec, context: int, gpu_mem_bytes: float, ep: int, ratio: float,
             host_mem_gb: float | None = None, gpus_per_node: int = 8) -> V4Capacity:
    if context < 4:
        raise SimConfigError(f"context = {context}: expected at least 4 tokens (one C4 entry); fix --context")
    if not 0 < ratio <= 1:
        raise SimConfigError(f"ratio = {ratio}: expected a fraction of the C4 entries in (0, 1]; fix --ratio")
    weights = weight_bytes_per_gpu(m, ep)
    reserve = const("non_cache_reserve_GB") * 1e9
    budget = gpu_mem_bytes - weights - reserve
    if budget <= 0:
        raise SimConfigError(f"weights {weights / 1e9:.1f} GB + reserve {reserve / 1e9:.1f} GB exceed the GPU's "
                             f"{gpu_mem_bytes / 1e9:.0f} GB: no cache fits; raise --ep or --gpu-mem-gb")
    resident, ess = request_parts(m, context, False, ratio), request_parts(m, context, True, ratio)
    host = host_bytes_per_token(m) * context
    host_max = None
    if host_mem_gb is not None:
        host_max = math.floor(host_mem_gb * 1e9 / (host * gpus_per_node))
    return V4Capacity(context, ratio, ep, weights, reserve, budget, resident, ess, host,
                      math.floor(budget / sum(resident.values())), math.floor(budget / sum(ess.values())), host_max)


V4_LAYER_KINDS = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}


def config_ratios(cfg: dict) -> list[int]:
    """Per layer its compress ratio, from SGLang's `compress_ratios` or transformers' `layer_types`
    (DeepseekV4Config; -1: a kind not known here)."""
    return [int(r) for r in cfg.get("compress_ratios") or []] or \
        [V4_LAYER_KINDS.get(t, -1) for t in cfg.get("layer_types") or []]


def config_head_dims(cfg: dict) -> tuple[int, int, int]:
    """(NoPE, RoPE, indexer head dim) of a V4 config (SGLang's or transformers' keys)."""
    rope = int(cfg.get("qk_rope_head_dim", 64))
    nope = int(cfg.get("qk_nope_head_dim") or int(cfg.get("head_dim", 512)) - rope)
    return nope, rope, int(cfg.get("index_head_dim", 128))


def config_window_tokens(cfg: dict) -> int:
    return int(cfg.get("window_size") or cfg.get("sliding_window") or 128)


def v4_entry_bytes(nope: int, rope: int) -> int:
    """One window row or compressed entry in SGLang's V4 layout: FP8 NoPE in 64-wide tiles with one UE8M0
    scale byte each + 1 pad byte, BF16 RoPE (448 + 64: 584 B)."""
    return nope + nope // 64 + 1 + 2 * rope


def v4_indexer_bytes(index_head_dim: int) -> int:
    """One C4 indexer key: FP8 values with a 4-byte scale per 128 (128: 132 B)."""
    return index_head_dim + index_head_dim // 128 * 4


def spec_from_config(cfg: dict, name: str = "config.json") -> V4Spec:
    """The cache part of a V4Spec from a model's config (SGLang's or transformers' keys): its layer kinds,
    window, head dims and index top-k, with SGLang's V4 layout; the pool constants a config does not carry
    (SWA page, compressor state rings and dtype) are SGLang 0.5.23's, as the V4-Flash data file gives them.
    Its weights are not known (total_params 0: weight_bytes_per_gpu refuses). Raises SimConfigError for a
    layer kind other than window only, C4 or C128 (V4.1's ratios 1 and 2 are not modelled)."""
    ratios = config_ratios(cfg)
    bad = sorted(set(ratios) - {0, 4, 128})
    if not ratios or bad:
        raise SimConfigError(f"{name}: compress ratios {bad or 'missing'}: expected per layer 0 (window only), 4 "
                             "(C4) or 128 (C128) in compress_ratios or layer_types (V4.1's ratios 1 and 2 are not "
                             "modelled)")
    nope, rope, idx = config_head_dims(cfg)
    pool = load_data(V4_MODELS["deepseek_v4_flash"])
    return V4Spec(
        name=name, ratios=tuple(ratios), window_tokens=config_window_tokens(cfg),
        swa_page_tokens=pool["swa_page_tokens"], entry_bytes=v4_entry_bytes(nope, rope),
        topk_entries=int(cfg.get("index_topk", 512)), index_head_dim=idx, indexer_bytes_per_entry=v4_indexer_bytes(idx),
        head_dim=nope + rope, state_bytes_per_value=pool["state_bytes_per_value"], c4_state_ring=pool["c4_state_ring"],
        c128_state_ring=pool["c128_state_ring"], total_params=0.0, hidden=int(cfg.get("hidden_size", 0)),
        routed_experts=int(cfg.get("n_routed_experts", 0)), moe_intermediate=int(cfg.get("moe_intermediate_size", 0)),
        vocab=int(cfg.get("vocab_size", 0)), routed_expert_bits=pool["routed_expert_bits"],
        other_param_bytes=pool["other_param_bytes"])


def config_summary(cfg: dict) -> str:
    """One sentence on a V4 config (SGLang's or transformers' keys): its layer kinds and the bytes ESS would move to
    the host, for the launcher's refusal on a CUDA node. Entry and indexer bytes by SGLang's V4 layout
    (v4_entry_bytes, v4_indexer_bytes)."""
    ratios = config_ratios(cfg)
    nope, rope, idx_dim = config_head_dims(cfg)
    entry = v4_entry_bytes(nope, rope)
    c4, c128 = ratios.count(4), ratios.count(128)
    other = len(ratios) - c4 - c128
    return (f"This V4 config has {len(ratios)} layers ({c4} C4, {c128} C128, {other} other), a "
            f"{config_window_tokens(cfg)}-token window per layer and {entry}-byte entries: ESS for V4 would keep "
            f"the C4 entries ({c4 * entry / 4:.0f} B per token) in host memory and on the GPU the windows, the C128 "
            f"entries ({c128 * entry / 128:.1f} B per token) and the C4 index keys "
            f"({c4 * v4_indexer_bytes(idx_dim) / 4:.0f} B per token); on a GPU node it is planned, not built "
            f"(docs/dsv4.md); `python -m sgl_ess.sim v4` sizes it")
