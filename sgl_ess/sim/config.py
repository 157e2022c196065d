"""Typed, frozen configuration for the simulator; each field's metadata generates a CLI flag.

Three user-facing groups (`DeploymentConfig`, `WorkloadConfig`, `OffloadConfig`), the serving layout
`plan` sizes host pools for (`ServingLayoutConfig`), plus the model facts (`ModelSpec`, loaded from
`data/model_<name>.json`). Every group validates itself in `__post_init__`
and raises `SimConfigError` naming the value received, what was expected and the flag that fixes it.
Nothing here holds memory or state; all objects are immutable.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from typing import Any

OVERLAP_STRATEGIES = ("none", "da", "dba", "full")
TRANSFER_METHODS = ("flashtrans", "memcpy")
KNOWN_MODELS = ("deepseek_v32_exp", "tiny_dsv32", "deepseek_v3", "glm_5", "glm_5_2", "hyv4", "longcat_flash_dsa")
MODEL_ALIASES = {"v3.2": "deepseek_v32_exp", "deepseek-v3.2": "deepseek_v32_exp", "deepseek-v3.2-exp": "deepseek_v32_exp",
                 "deepseek-v3": "deepseek_v3", "v3": "deepseek_v3", "glm-5": "glm_5", "glm-5.1": "glm_5",
                 "glm5": "glm_5", "glm-5.2": "glm_5_2", "glm5.2": "glm_5_2", "hunyuan-v4": "hyv4",
                 "hy-v4": "hyv4", "longcat": "longcat_flash_dsa", "longcat-flash": "longcat_flash_dsa"}


def model_name(name: str) -> str:
    """The data-file name of a model given as a file name or a common spelling (glm-5.2, v3.2, ...)."""
    return MODEL_ALIASES.get(name.lower(), name)
SHARE_HOST_POOL = ("auto", "shared", "per-rank")
KV_CACHE_DTYPES = ("fp8_e4m3", "bf16")
MTP_DRAFT_ACCEPTANCE = 0.7   # paper Table 2: MTP 2 accepts 1.7 tokens per step -> 0.7 per draft token


V4_NAMES = ("deepseek_v4_flash", "v4", "v4-flash", "deepseek-v4", "deepseek-v4-flash", "dsv4")


def unknown_model(name: str) -> str:
    """The message for a --model the step-time model does not know (DeepSeek-V4 has its own command)."""
    if name.lower() in V4_NAMES:
        return (f"model = {name!r}: DeepSeek-V4 is not MLA + DSA, and the step-time model does not cover it; "
                f"its capacity (bytes per request, largest batch resident vs ESS) is `python -m sgl_ess.sim v4`")
    return f"model = {name!r}: unknown; expected one of {', '.join(KNOWN_MODELS)}; fix --model"


class SimConfigError(ValueError):
    """A user-facing configuration error; the CLI prints it and exits with status 2."""


def flag(default: Any, help: str, flag_name: str | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field whose metadata carries its CLI help text (and optional flag spelling and choices)."""
    return field(default=default, metadata={"help": help, "flag": flag_name, "choices": choices})


def flag_of(cls: type, name: str) -> str:
    for f in fields(cls):
        if f.name == name:
            return f.metadata.get("flag") or "--" + name.replace("_", "-")
    raise KeyError(name)


def _positive(cls: type, name: str, value: float, allow_zero: bool = False) -> None:
    ok = value >= 0 if allow_zero else value > 0
    if not ok:
        want = ">= 0" if allow_zero else "> 0"
        raise SimConfigError(f"{name} = {value!r}: expected a number {want}; fix {flag_of(cls, name)}")


def load_data(name: str) -> dict:
    """Read one packaged JSON file from sgl_ess/sim/data (no dependency on ../shared)."""
    return json.loads(resources.files("sgl_ess.sim").joinpath("data").joinpath(name).read_text())


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts of a DeepSeek-V3.2-architecture model that the cost and memory models read."""
    name: str
    num_layers: int
    num_dense_layers: int
    num_mtp_layers: int
    hidden: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_dim: int
    qk_rope_dim: int
    v_head_dim: int
    index_heads: int
    index_head_dim: int
    topk_tokens: int
    routed_experts: int
    experts_per_token: int
    shared_experts: int
    moe_intermediate: int
    dense_intermediate: int
    vocab: int
    latent_bytes_per_token_layer: int
    indexer_bytes_per_token_layer: int
    index_anchor_layers: int = -1     # decoder layers that compute their own top-k (-1: all); 0 = dense MLA
    index_key_layers: int = -1        # layers that keep indexer keys in the cache (-1: cached_layers)
    attention_sublayers: int = 1      # attention layers per decoder layer (LongCat-Flash: 2, each with its rows)
    attention_sinks: bool = False     # a learnable per-head sink logit in every softmax (Hunyuan V4)
    dense_mlps_per_layer: int = 0     # dense MLPs beside the MoE in every MoE layer (LongCat-Flash: 2)
    mtp_dense_ffn: bool = False       # the MTP layer's FFN is a dense MLP, not an MoE (LongCat-Flash's NextN)

    @classmethod
    def load(cls, name: str = "deepseek_v32_exp") -> "ModelSpec":
        name = model_name(name)
        if name not in KNOWN_MODELS:
            raise SimConfigError(unknown_model(name))
        return _load_model(name)

    @classmethod
    def deepseek_v32_exp(cls) -> "ModelSpec":
        return cls.load("deepseek_v32_exp")

    @property
    def dense_attention(self) -> bool:
        """No indexer: attention reads the whole context (DeepSeek-V3's MLA); ESS does not apply."""
        return self.topk_tokens == 0

    @property
    def anchors(self) -> int:
        """Decoder layers that run the indexer (GLM-5.2 shares one top-k over the layers after an anchor)."""
        return self.num_layers if self.index_anchor_layers < 0 else self.index_anchor_layers

    def is_anchor(self, layer: int) -> bool:
        """Whether decoder layer `layer` (num_layers = the MTP layer) runs the indexer. The first dense
        layers are anchors and the rest are spread evenly over the MoE layers (only the count is taken
        from the config; the MTP layer runs its own indexer)."""
        if self.dense_attention:
            return False
        n, a, nd = self.num_layers, self.anchors, self.num_dense_layers
        if layer >= n or a >= n:
            return True
        if layer < nd:
            return layer < a
        rest, moe, i = a - min(a, nd), n - nd, layer - nd
        return (i + 1) * rest // moe - i * rest // moe == 1

    @property
    def index_layers(self) -> int:
        """Layers whose indexer keys are cached (per request, per token)."""
        if self.dense_attention:
            return 0
        return self.cached_layers if self.index_key_layers < 0 else self.index_key_layers

    @property
    def cached_layers(self) -> int:
        """Layers that keep a latent + indexer cache: the attention layers of the decoder (num_hidden_layers x
        attention_sublayers, SGLang's ModelConfig.num_attention_layers) plus the MTP layer(s)."""
        return self.num_layers * self.attention_sublayers + self.num_mtp_layers

    def cached_of(self, layer: int) -> range:
        """Cached-layer indices of decoder layer `layer` (num_layers and above: the MTP layers, one each)."""
        if layer >= self.num_layers:
            first = self.num_layers * self.attention_sublayers + layer - self.num_layers
            return range(first, first + 1)
        return range(layer * self.attention_sublayers, (layer + 1) * self.attention_sublayers)

    def shape_signature(self) -> dict[str, int]:
        """The dimensions an op profile's tables depend on (a profile measured at other shapes is refused)."""
        return {k: getattr(self, k) for k in ("hidden", "heads", "q_lora_rank", "kv_lora_rank", "qk_nope_dim",
                                              "qk_rope_dim", "v_head_dim", "index_heads", "index_head_dim",
                                              "topk_tokens", "routed_experts", "experts_per_token",
                                              "moe_intermediate", "dense_intermediate", "vocab")}


@lru_cache(maxsize=None)
def _load_model(name: str) -> ModelSpec:
    d = load_data(f"model_{name}.json")
    return ModelSpec(
        name=name, num_layers=d["num_hidden_layers"], num_dense_layers=d["first_k_dense_replace"],
        num_mtp_layers=d["num_nextn_predict_layers"], hidden=d["hidden_size"],
        heads=d["num_attention_heads"], q_lora_rank=d["q_lora_rank"], kv_lora_rank=d["kv_lora_rank"],
        qk_nope_dim=d["qk_nope_head_dim"], qk_rope_dim=d["qk_rope_head_dim"], v_head_dim=d["v_head_dim"],
        index_heads=d["index_n_heads"], index_head_dim=d["index_head_dim"], topk_tokens=d["index_topk"],
        routed_experts=d["n_routed_experts"], experts_per_token=d["num_experts_per_tok"],
        shared_experts=d["n_shared_experts"], moe_intermediate=d["moe_intermediate_size"],
        dense_intermediate=d["intermediate_size"], vocab=d["vocab_size"],
        latent_bytes_per_token_layer=d["latent_bytes_per_token_layer"],
        indexer_bytes_per_token_layer=d["indexer_bytes_per_token_layer"],
        index_anchor_layers=d.get("index_anchor_layers", -1), index_key_layers=d.get("index_key_layers", -1),
        attention_sublayers=d.get("attention_sublayers", 1), attention_sinks=d.get("attention_sinks", False),
        dense_mlps_per_layer=d.get("dense_mlps_per_layer", 0), mtp_dense_ffn=d.get("mtp_dense_ffn", False))


@dataclass(frozen=True)
class DeploymentConfig:
    """Cluster shape (paper Table 1: 4 nodes x 8 GPUs, TP 1, DP attention, EP 32, TBO on) and its inputs."""
    hardware: str = flag("h200", "GPU profile name from data/hardware.json (the paper does not name its "
                                 "GPU; h200 is the standard GPU on which the paper's batch 52 at 32K fits)")
    model: str = flag("deepseek_v32_exp", f"model whose shapes are simulated: {' | '.join(KNOWN_MODELS)}")
    op_profile: str | None = flag(None, "operator profile JSON (file path, or the name of a shipped one: "
                                        "h200_published); default: h200_published. Format: sgl_ess/sim/README.md")
    nodes: int = flag(4, "number of nodes")
    gpus_per_node: int = flag(8, "GPUs per node")
    ep: int = flag(32, "expert-parallel degree (experts are sharded over this many GPUs)")
    tbo: bool = flag(True, "Two-Batch Overlap: split the batch in two micro-batches that hide communication")
    cuda_graph: bool = flag(True, "decode runs as CUDA graphs (SGLang's default): each kernel costs the published "
                                  "graph-node launch gap; off: the published stream-launch gap")
    gpu_mem_gb: float | None = flag(None, "override the GPU memory capacity in GB (default: the profile's)")
    host_mem_gb: float | None = flag(None, "host memory per node in GB for the ESS pool (default: unlimited; "
                                           "plan and run report the need)")

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "ep"):
            _positive(DeploymentConfig, name, getattr(self, name))
        if self.gpu_mem_gb is not None:
            _positive(DeploymentConfig, "gpu_mem_gb", self.gpu_mem_gb)
        if self.host_mem_gb is not None:
            _positive(DeploymentConfig, "host_mem_gb", self.host_mem_gb)
        if self.ep > self.nodes * self.gpus_per_node:
            raise SimConfigError(f"ep = {self.ep}: expected at most nodes x gpus_per_node = "
                                 f"{self.nodes * self.gpus_per_node}; fix --ep or --nodes")
        object.__setattr__(self, "model", model_name(self.model))
        if self.model not in KNOWN_MODELS:
            raise SimConfigError(unknown_model(self.model))

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class WorkloadConfig:
    """One decode operating point. Batch is per GPU (DP attention); throughput is per node."""
    context_tokens: int = flag(32768, "context length per request in tokens", "--context")
    mtp: int = flag(2, "tokens verified per request per step (1 = no MTP; 2 = one draft token)")
    accept: float | None = flag(None, "accepted tokens per step, in [1, mtp] (default: the paper's 0.7 "
                                      "per-draft acceptance compounded: 1.7 at mtp 2, 2.533 at mtp 4)")
    batch: int = flag(52, "requests per GPU")
    output_tokens: int = flag(2048, "output tokens per request (amortizes the cold-start misses without warmup)")

    def __post_init__(self) -> None:
        for name in ("context_tokens", "mtp", "batch", "output_tokens"):
            _positive(WorkloadConfig, name, getattr(self, name))
        if self.accept is not None and not (1.0 <= self.accept <= self.mtp):
            raise SimConfigError(f"accept = {self.accept!r}: expected accepted tokens per step in "
                                 f"[1, mtp = {self.mtp}]; fix --accept or --mtp")

    @property
    def accept_tokens(self) -> float:
        """Accepted tokens per step; default compounds the paper's 0.7 per-draft acceptance."""
        if self.accept is not None:
            return self.accept
        return sum(MTP_DRAFT_ACCEPTANCE ** i for i in range(self.mtp))


@dataclass(frozen=True)
class OffloadConfig:
    """ESS offload knobs. ratio = 1.0 means no offload (everything on GPU, no ESS transfers)."""
    ratio: float = flag(1.0, "sparse memory ratio r = GPU latent slots / latent entries, in (0, 1]")
    overlap: str = flag("full", "transfer overlap: none | da | dba | full (per-layer best of da/dba)")
    transfer: str = flag("flashtrans", "host->GPU copy method: flashtrans (GPU threads on pinned memory) | "
                                      "memcpy (one cudaMemcpyAsync per 656 B row)")
    pcie_h2d_gbps: float | None = flag(None, "effective host->GPU rate in GB/s (1e9 B/s; default: the paper's "
                                             "FlashTrans 37 GB/s, scaled by the profile's PCIe generation)")
    warmup: bool = flag(True, "LRU warmup with the prefill's last top-k ids (off: cold-start burst)")
    hit_rate: float | None = flag(None, "override the simulated hit rate (fraction of top-k entries found on "
                                        "GPU, in [0, 1]); default: exact LRU over the locality model")

    def __post_init__(self) -> None:
        if not (0.0 < self.ratio <= 1.0):
            raise SimConfigError(f"ratio = {self.ratio!r}: expected a sparse memory ratio in (0, 1]; "
                                 f"fix --ratio")
        if self.overlap not in OVERLAP_STRATEGIES:
            raise SimConfigError(f"overlap = {self.overlap!r}: expected one of {', '.join(OVERLAP_STRATEGIES)}; "
                                 f"fix --overlap")
        if self.transfer not in TRANSFER_METHODS:
            raise SimConfigError(f"transfer = {self.transfer!r}: expected one of {', '.join(TRANSFER_METHODS)}; "
                                 f"fix --transfer")
        if self.pcie_h2d_gbps is not None:
            _positive(OffloadConfig, "pcie_h2d_gbps", self.pcie_h2d_gbps)
        if self.hit_rate is not None and not (0.0 <= self.hit_rate <= 1.0):
            raise SimConfigError(f"hit_rate = {self.hit_rate!r}: expected a fraction in [0, 1]; fix --hit-rate")

    @property
    def offload(self) -> bool:
        return self.ratio < 1.0


@dataclass(frozen=True)
class ServingLayoutConfig:
    """SGLang's parallel flags, for `plan`'s host pools per node (sim/host_pools.py). The step-time model
    stays DP attention + EP over --nodes x --gpus-per-node; only the host-pool report follows these."""
    tp: int | None = flag(None, "SGLang --tp (default: every GPU, --nodes x --gpus-per-node)")
    dp: int | None = flag(None, "SGLang --dp (default: --tp with DP attention, else 1)")
    enable_dp_attention: bool | None = flag(None, "SGLang --enable-dp-attention: dp attention groups of tp / dp "
                                                  "ranks (default: on when neither --tp nor --dp is given, the "
                                                  "deployment the step model simulates; else off)")
    attn_dp_size: int | None = flag(None, "SGLang --attn-dp-size N: DP attention over N groups of tp / N ranks "
                                          "(SGLang 0.5.23's spelling of --dp N --enable-dp-attention)")
    nnodes: int | None = flag(None, "SGLang --nnodes (default: --nodes)")
    share_host_pool: str = flag("auto", "host pools of an attention-TP group's ranks on one node: shared (one "
                                        "pool per group, the CPU serving path) | per-rank (one copy per rank, "
                                        "the launcher's auto on CUDA) | auto (= per-rank, as the launcher on a CUDA node)",
                                choices=SHARE_HOST_POOL)
    max_total_tokens: int | None = flag(None, "tokens per host pool, as the launcher's --max-total-tokens "
                                              "(default: the planned batch x --context)")
    kv_cache_dtype: str = flag("fp8_e4m3", "host latent row: fp8_e4m3 (FlashMLA's row, 656 B for DeepSeek-V3.2; "
                                           "the CUDA default) | bf16 ((kv_lora_rank + rope) x 2 B, 1152 B; the "
                                           "CPU path)", choices=KV_CACHE_DTYPES)

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "attn_dp_size", "nnodes", "max_total_tokens"):
            if getattr(self, name) is not None:
                _positive(ServingLayoutConfig, name, getattr(self, name))
        if self.share_host_pool not in SHARE_HOST_POOL:
            raise SimConfigError(f"share_host_pool = {self.share_host_pool!r}: expected one of "
                                 f"{', '.join(SHARE_HOST_POOL)}; fix --share-host-pool")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise SimConfigError(f"kv_cache_dtype = {self.kv_cache_dtype!r}: expected one of "
                                 f"{', '.join(KV_CACHE_DTYPES)}; fix --kv-cache-dtype")


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulated operating point needs."""
    deploy: DeploymentConfig = field(default_factory=DeploymentConfig)
    work: WorkloadConfig = field(default_factory=WorkloadConfig)
    ess: OffloadConfig = field(default_factory=OffloadConfig)
