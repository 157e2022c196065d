"""How one node's ESS memory is sized before anything loads: the host pool(s) in host memory and the
hot buffers on each GPU. Called by launcher_defaults.fill_defaults; the result (a dict, exported as
``SGLESS_POOL_SIZING``, printed by ``--ess-explain``) says where every number came from.

Host pool, per NODE (with ESS on, SGLang's token pool IS the host pool; one per rank, or one per
attention-TP group when its ranks share it - core/parallel_layout.py):
  * ``--ess-memory-pool-size-gb G``: the node's budget, G / pools per node for each pool;
  * ``--max-total-tokens N``: N tokens per pool (both given: refused unless they agree);
  * neither, on CUDA: the node's usable host memory (MemAvailable minus the safety margin,
    serving/host_memory.py) / pools per node - named as a default in every message;
  * neither, on CPU: 65536 tokens per pool (16384 with ESS off), also named as a default.
The node's pools together are then checked against usable host memory. Device bytes per GPU: the
store's whole device allocation (StoreConfig.device_allocation of the StoreConfig the scheduler will
build, pools/pool_adapter.store_config: hot buffers with the slots per request per layer of
core/hot_slots.py, staging rings, speculative rows, LRU state, token map, counters), checked against
the GPU's memory when it is known. An MTP draft model's store is not included. DeepSeek-V4 (no DSA
latent: its C4 entries in ESS's host store) is sized by v4_plan.py. Owns no memory.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional

from sgl_ess.config import EssConfig
from sgl_ess.core.parallel_layout import host_pool_bytes
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import (DSA_PAGE_SIZE, ModelGeometry, PreflightError, check_hot_slots,
                                       hot_slots_per_request, resolve_pool_tokens)

from . import v4_plan
from .argv_view import flag_value, has_flag, int_flag, parallel_layout, pools_per_node
from .node_devices import GIB, NodeDevices

logger = logging.getLogger("sgl_ess")

DEFAULT_HOST_TOKENS = 65536          # ESS on, CPU: host pool tokens when nothing sizes it
DEFAULT_DEVICE_TOKENS = 16384        # ESS off: device pool tokens when nothing sizes it

# returns a ModelGeometry, a v4_plan.V4Model for DeepSeek-V4, or None (no MLA latent)
GeometryReader = Callable[[str, bool, Optional[str]], Optional[object]]


@dataclasses.dataclass(frozen=True)
class ConfiguredGeometry(ModelGeometry):
    """The geometry with the model config it was read from (read_geometry): the store's shared-index groups
    (StoreConfig.layer_anchors) come from it, by the scheduler's own rule (store_device_bytes)."""
    hf_config: object = dataclasses.field(default=None, compare=False, repr=False)


def read_geometry(model: str, trust_remote_code: bool, revision: Optional[str]) -> Optional[ModelGeometry]:
    from transformers import AutoConfig

    from .model_config import _as_sglang_reads_it, load_geometry

    geo = load_geometry(model, trust_remote_code, revision)
    if not isinstance(geo, ModelGeometry):
        return geo                                        # None, or DeepSeek-V4's V4Model (v4_plan.py)
    # read again as load_geometry did (it succeeded, so this does): its value is not returned by it
    cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, revision=revision)
    cfg = _as_sglang_reads_it(model, cfg, trust_remote_code, revision)
    return ConfiguredGeometry(**{f.name: getattr(geo, f.name) for f in dataclasses.fields(geo)}, hf_config=cfg)


def speculative(out: list[str]) -> bool:
    """--speculative-algorithm given and not NONE (as pools/device_budget.draft_tokens reads SGLang's)."""
    return flag_value(out, "--speculative-algorithm") not in (None, "", "NONE")


def fp8_geometry(geo: ModelGeometry) -> ModelGeometry:
    """The geometry with FlashMLA's FP8 row: kv_lora_rank fp8 + 4 B scale per 128 + rope bf16."""
    r, p = geo.kv_lora_rank, geo.qk_rope_head_dim
    if r is None or p is None:
        return geo
    return dataclasses.replace(geo, latent_row_bytes=r + 4 * (r // 128) + 2 * p)


def kv_cache_dtype(out: list[str], devices: NodeDevices) -> tuple[str, str]:
    """(the latent cache dtype the server will use, why). On CUDA with ESS on the launcher sets fp8_e4m3
    when --kv-cache-dtype is not given (launcher_defaults.cuda_ess_defaults); for ``auto`` SGLang 0.5.23
    picks for a DSA model by the GPU (arg_groups/overrides.py: fp8_e4m3 on SM >= 10 without learnable
    sinks, else bfloat16; an H200 is SM 9.0, so bfloat16). On CPU the ess backend keeps bfloat16 rows."""
    given = flag_value(out, "--kv-cache-dtype")
    if given in ("bf16", "bfloat16"):
        return "bfloat16", f"--kv-cache-dtype {given}"
    if given not in (None, "auto"):
        return given, f"--kv-cache-dtype {given}"
    if not devices.has_cuda:
        return "bfloat16", f"--kv-cache-dtype {given or 'unset'} on CPU: the ess backend's bfloat16 rows"
    if devices.sm_major is None:
        return "bfloat16", ("--kv-cache-dtype auto: SGLang picks fp8_e4m3 on SM >= 10, bfloat16 below; this node's SM "
                            f"is not known ({devices.source}), so the larger bfloat16 row is planned; give "
                            "--kv-cache-dtype to plan exactly")
    dtype = "fp8_e4m3" if devices.sm_major >= 10 else "bfloat16"
    return dtype, f"--kv-cache-dtype auto: SGLang picks {dtype} for a DSA model on SM {devices.sm_major}"


def plan(out: list[str], cfg: EssConfig, devices: NodeDevices, geometry: GeometryReader = read_geometry
         ) -> tuple[dict, Optional[ModelGeometry]]:
    """(the sizing of `out`, the model's geometry as sized: None with ESS off or without an MLA latent, and
    for DeepSeek-V4, whose sizing is ``sizing["dsv4"]``, v4_plan.py). `out` is the SGLang argv so far;
    --max-total-tokens is appended when the launcher chose it. Raises PreflightError."""
    has_cuda = devices.has_cuda
    model = flag_value(out, "--model-path") or ""
    geo = geometry(model, has_flag(out, "--trust-remote-code"), flag_value(out, "--revision")) if cfg.enabled else None
    v4, geo = (geo, None) if isinstance(geo, v4_plan.V4Model) else (None, geo)
    if v4 is not None:
        check_v4(model, v4, cfg, devices)
    kv_dtype, kv_dtype_source = kv_cache_dtype(out, devices)
    if geo is not None and kv_dtype == "fp8_e4m3":
        geo = fp8_geometry(geo)
    page = int_flag(out, "--page-size") or DSA_PAGE_SIZE
    given = int_flag(out, "--max-total-tokens")
    lay = parallel_layout(out)
    pools = pools_per_node(lay, has_cuda, cfg.share_host_pool) if cfg.enabled else 1
    info = devices.meminfo()
    usable = host_memory.usable_bytes(info)
    pool_gb, budget_source = cfg.memory_pool_size_gb, None
    if has_cuda and cfg.enabled and not pool_gb and given is None and usable:
        pool_gb = usable / 1e9
        margin = host_memory.safety_margin_bytes(info["MemTotal"])
        budget_source = (f"default {pool_gb:.2f} GB per node = usable host memory (MemAvailable "
                         f"{info['MemAvailable'] / 1e9:.2f} GB - {margin / 1e9:.2f} GB kept free) / {pools} host "
                         f"pool(s) per node; set --ess-memory-pool-size-gb to change")
    default = DEFAULT_HOST_TOKENS if cfg.enabled else DEFAULT_DEVICE_TOKENS
    tokens, source = resolve_pool_tokens(cfg.enabled, pool_gb, given, geo, page, default, pools=pools,
                                         budget_source=budget_source)
    if source == "launcher default":
        source = (f"default {tokens} tokens per pool (the launcher's default{' on CPU' if cfg.enabled else ''}; set "
                  f"--max-total-tokens{' or --ess-memory-pool-size-gb' if cfg.enabled else ''} to change)")
    if given is None:
        out += ["--max-total-tokens", str(tokens)]
    if budget_source:
        logger.info("ESS host pool: %s: %d tokens per pool", budget_source, tokens)
    if not cfg.enabled and cfg.memory_pool_size_gb:
        logger.warning("memory_pool_size_gb=%g is NOT applied: ESS is off, so there is no host pool; the device "
                       "pool has %d tokens (%s)", cfg.memory_pool_size_gb, tokens, source)
    sizing = {"tokens": tokens, "source": source, "ess_enabled": cfg.enabled, "page_size": page,
              "memory_pool_size_gb_requested": cfg.memory_pool_size_gb or None,
              "host_memory": {"mem_total_bytes": info.get("MemTotal"), "mem_available_bytes": info.get("MemAvailable"),
                              "usable_bytes": usable, "source": devices.host_memory_source()},
              "devices": dataclasses.asdict(devices)}
    if v4 is not None:
        sizing["dsv4"] = v4_plan.plan(model, v4, cfg, int_flag(out, "--max-running-requests"),
                                      int_flag(out, "--context-length"), tokens, usable)
    if cfg.enabled and geo is not None:
        sizing["model"] = {"path": model, "layers": geo.layers, "latent_row_bytes": geo.latent_row_bytes,
                           "index_topk": geo.index_topk, "kv_cache_dtype": kv_dtype,
                           "kv_cache_dtype_source": kv_dtype_source}
        sizing["host_bytes_expected"] = host_pool_bytes(tokens, page, geo.layers, geo.latent_row_bytes)
        sizing.update(pools_per_node=pools, ranks_per_node=lay["ranks_per_node"],
                      host_bytes_per_node=pools * sizing["host_bytes_expected"])
        if pools > 1 or lay["ranks_per_node"] > 1:
            logger.info("ESS host pools on this node: %d pool(s) of %.3f GB = %.3f GB for %d rank(s) (%s)", pools,
                        sizing["host_bytes_expected"] / 1e9, sizing["host_bytes_per_node"] / 1e9,
                        lay["ranks_per_node"], "one per attention-TP group on this node, shared by its ranks"
                        if pools < lay["ranks_per_node"] else "one per rank")
        if cfg.memory_pool_size_gb and pools > 1:
            sizing["pool_budget_split"] = (
                f"--ess-memory-pool-size-gb {cfg.memory_pool_size_gb:g} is GB per NODE, split over its {pools} host "
                f"pools: {cfg.memory_pool_size_gb / pools:.2f} GB each (it was GB per pool before sgl-ess's "
                f"per-node sizing; give {cfg.memory_pool_size_gb * pools:g} for the old meaning)")
            logger.warning("%s", sizing["pool_budget_split"])
        host_memory.check_host_pool(sizing["host_bytes_per_node"],
                                    source if pools == 1 or budget_source or cfg.memory_pool_size_gb
                                    else f"{source}, x {pools} pools on this node", info=info)
        running = int_flag(out, "--max-running-requests")
        sizing["hot_slots_per_request"] = check_hot_slots(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb,
                                                          geo, running)
        if sizing["hot_slots_per_request"]:
            # the rule's own words for where the number came from (core/hot_slots.py), for messages
            sizing["hot_slots_source"] = hot_slots_per_request(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb,
                                                               geo, running)[1]
            sizing.update(store_device_bytes(cfg, geo, out, running, lay, has_cuda))
        if has_cuda:
            check_gpus(devices, lay["ranks_per_node"], sizing.get("device_bytes_per_device"))
    return sizing, geo


def check_v4(model: str, v4, cfg: EssConfig, devices: NodeDevices) -> None:
    """What the launcher refuses for DeepSeek-V4 with ESS on before sizing it: a CUDA node (ESS serves V4 on
    the CPU dsv4 arm only; model_support refuses it when the node running the launcher has CUDA, this
    when --ess-explain-device plans for one) and --ess-memory-pool-size-gb (V4's host store holds request
    rows x context, not a token budget). Raises PreflightError."""
    if devices.has_cuda:
        from sgl_ess.sim.dsv4 import config_summary

        raise PreflightError(f"--model-path {model}: ESS serves DeepseekV4ForCausalLM on the CPU dsv4 arm only, not "
                             f"on a CUDA node ({devices.source}); serve it there with --ess-enabled false. "
                             + config_summary(v4.config))
    if cfg.memory_pool_size_gb:
        raise PreflightError(f"--ess-memory-pool-size-gb {cfg.memory_pool_size_gb:g}: DeepSeek-V4's ESS host store "
                             "holds a fixed number of C4 entries per request row, sized by --max-running-requests and "
                             "--context-length, not a token budget; drop --ess-memory-pool-size-gb")


def store_device_bytes(cfg: EssConfig, geo: ModelGeometry, out: list[str], running: int, lay: dict,
                       has_cuda: bool) -> dict:
    """The device bytes of the store one rank builds, by the scheduler's own StoreConfig (the same call
    pools/cuda_memory.ess_device_bytes makes): request rows = --max-running-requests per DP-attention
    worker + SGLang's padding row; columns = --context-length, else the model's (SGLang's get_context_length);
    layer_anchors as the scheduler's store gets them (pools/pool_adapter.store_anchors: a shared-index model
    keeps one LRU table per group of layers, one per layer with --speculative-algorithm), from the model
    config read_geometry read (a geometry given without it, as in tests: none)."""
    from ..pools.pool_adapter import store_anchors, store_config

    workers = lay["dp"] if lay["dp_attention"] else 1
    rows = max(1, running // workers) + 1
    ctx = int_flag(out, "--context-length") or geo.context_len or 131072
    ctx_source = ("--context-length" if int_flag(out, "--context-length") else
                  "the model's config" if geo.context_len else "not known: StoreConfig's default")
    # MTP: the store's scratch rows for a verify's own rows (store/verify_slots.py), from the draft-token
    # count given on the command line (SGLang's own default, when it is not given, is not known here)
    spec = speculative(out)
    draft = (int_flag(out, "--speculative-num-draft-tokens") or 0) if spec else 0
    hf_config = getattr(geo, "hf_config", None)
    anchors = store_anchors(hf_config, geo.layers, spec) if hf_config is not None else ()
    sc = store_config(cfg, geo.layers, geo.latent_row_bytes, int(geo.index_topk), rows, ctx,
                      "cuda" if has_cuda else "cpu", 1, draft_tokens=draft, layer_anchors=anchors)
    alloc = sc.device_allocation()
    return {"request_rows": rows, "context_tokens": ctx, "context_tokens_source": ctx_source,
            "store_hot_slots_per_request": sc.hot_slots_per_request, "device_allocation": alloc,
            "lru_tables": len(set(sc.anchors)),
            "device_bytes_per_device": sum(alloc.values())}


def check_gpus(devices: NodeDevices, ranks_per_node: int, store_bytes: Optional[int]) -> None:
    """Each rank of the node needs a GPU of its own, and each GPU must hold its rank's ESS store."""
    if devices.gpus and ranks_per_node > devices.gpus:
        raise PreflightError(f"{ranks_per_node} ranks per node (--tp-size x --pp-size, x --dp-size without DP "
                             f"attention, / --nnodes) but the node has {devices.gpus} GPU(s) ({devices.source}); "
                             f"lower --tp-size / --dp-size, or spread the ranks with --nnodes")
    if store_bytes and devices.gpu_memory_bytes and store_bytes > devices.gpu_memory_bytes:
        raise PreflightError(f"the ESS store (hot buffers, rings, LRU state, token map) needs {store_bytes / GIB:.1f} "
                             f"GiB on each GPU, but a GPU has "
                             f"{devices.gpu_memory_bytes / GIB:.1f} GiB ({devices.source}); lower "
                             f"--ess-hot-slots-per-request or --max-running-requests, or set "
                             f"--ess-max-gpu-buffer-size-gb")
