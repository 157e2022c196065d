"""ESS on for DeepSeek-V4 on the CPU dsv4 arm: builds the runner's C4EntryStore (c4_store.py) from the
launcher's ESS config and hooks it into sgl-ess's request lifecycle (pools/lifecycle.py: SGLang freeing a
request row closes its hot buffer, SGLang freeing pages zeroes the C4 entries stored at their locations;
``/ess/status`` reports its usage).

What this slice implements, and what it refuses with ESS on (never a silent fallback): the CPU, one
scheduler (no TP / DP / PP ranks), MTP with chain drafts (EAGLE / NEXTN, topk 1: the target's verify
resolves its draft tokens' top-k as one union per C4 layer; the draft's one layer is window-only, so the
draft runner has no store), no PD disaggregation, no CUDA / CPU
graphs; the radix cache works (host rows are keyed by C4 location, as SGLang's V4 pool keys its entries, so
a cached prefix's entries are found where the request that computed them wrote them); the inline or the
worker fetch engine
(``--ess-prefetch-engine``; auto: engine_choice.auto_cpu_engine's rule, the worker with >= 4 cores per rank),
the worker with DA / DBA (``--ess-prefetch-overlap-level``; 'full' per layer from ``--ess-overlap-profile``).
One store per model runner (SGLang may build its backend more than once).
"""

from __future__ import annotations

import logging

from sgl_ess.config import EssConfig, config_from_env

logger = logging.getLogger(__name__)
_stores: dict[int, "V4EssAdapter"] = {}


def full_allocator(runner):
    """SGLang's allocator of the full KV pool's pages (V4: SWATokenToKVPoolAllocator's full_attn_allocator, a
    PagedTokenToKVPoolAllocator): the locations req_to_token holds, whose pages the lifecycle hooks see freed."""
    alloc = runner.token_to_kv_pool_allocator
    return getattr(alloc, "full_attn_allocator", alloc)


def pool_tokens(runner) -> int:
    """The full KV pool's locations, page 0 (SGLang's padding page) included."""
    alloc = full_allocator(runner)
    return int(alloc.size) + int(alloc.page_size)


class V4EssAdapter:
    """What pools/lifecycle.py's hooks and /ess/status call on an ESS store, for the V4 C4 store. Host rows
    are keyed by C4 location (a block's last token location // 4), so SGLang freeing pages (a request without
    the radix cache, an evicted prefix, a flush) zeroes the entries stored there. Its host_tokens_* in
    /ess/status count C4 entries (``host_row_unit``); SGLang's token pool split shows as kv_pool_*."""

    host_row_unit = "C4 entry"

    def __init__(self, runner, store):
        self.runner_id = id(runner)
        self.allocator = full_allocator(runner)
        self.req_pool = runner.req_to_token_pool
        self.c4 = store
        self.store_cfg = store.cfg
        self.layers = store.cfg.num_layers
        self.row_bytes = store.cfg.row_bytes

    def close_rows(self, rows: list[int]) -> None:
        self.c4.close_rows(rows)

    def clear_locs(self, locs) -> None:
        self.c4.clear_locs(locs)

    def clear_all(self) -> None:
        """SGLang cleared its allocator (a flush): every C4 location's host row."""
        self.c4.clear_all()

    def is_open(self, req: int) -> bool:
        return self.c4.store.is_open(req)

    def usage(self) -> dict:
        return {"model": "DeepseekV4ForCausalLM (C4 entries)", **self.c4.usage()}


def refusals(runner, cfg: EssConfig) -> list[str]:
    """What this slice does not implement, for the runner's server args (empty: it runs)."""
    args = runner.server_args
    out = []
    if not str(runner.device).startswith("cpu"):
        out.append(f"device {runner.device} (the CPU dsv4 arm only)")
    algo = getattr(args, "speculative_algorithm", None)
    if algo and str(algo).upper() not in ("EAGLE", "NEXTN", "MTP"):
        out.append(f"--speculative-algorithm {algo} (EAGLE / NEXTN, V4's MTP layer, only)")
    if algo and int(getattr(args, "speculative_eagle_topk", 1) or 1) != 1:
        out.append(f"--speculative-eagle-topk {args.speculative_eagle_topk} (chain drafts only: 1)")
    if str(getattr(args, "disaggregation_mode", "null")) != "null":
        out.append(f"--disaggregation-mode {args.disaggregation_mode} (PD)")
    for flag in ("tp_size", "dp_size", "pp_size"):
        if int(getattr(args, flag, 1) or 1) != 1:
            out.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    if getattr(args, "enable_torch_compile", False):
        out.append("--enable-torch-compile (graphs; the arm's init_cuda_graph_state refuses CUDA graphs)")
    if cfg.prefetch_engine not in ("auto", "inline", "worker"):
        out.append(f"--ess-prefetch-engine {cfg.prefetch_engine} (inline or worker on the CPU arm)")
    if cfg.speculative_prefetch != "off":
        out.append(f"--ess-speculative-prefetch {cfg.speculative_prefetch}")
    return out


def c4_store_for(runner, hf, req_to_token):
    """The runner's V4EssAdapter's C4EntryStore (built on first use and registered with the lifecycle
    hooks), or None with ESS off. Raises NotImplementedError for what the slice does not implement."""
    cfg = config_from_env() or EssConfig()
    if not cfg.enabled:
        return None
    if getattr(runner, "is_draft_worker", False):
        return None        # V4's MTP layer is a window-only layer (compress ratio 0): nothing for the host store
    known = _stores.get(id(runner))
    if known is not None:
        return known.c4
    bad = refusals(runner, cfg)
    if bad:
        raise NotImplementedError("DeepSeek-V4 with ESS on is implemented on the CPU dsv4 arm only, without: "
                                  + "; ".join(bad) + ". Serve with --ess-enabled false for these")
    from sgl_ess.core.hot_slots import hot_slots_rule

    from ..pools import lifecycle
    from .c4_store import C4EntryStore

    c4_layers = [i for i, r in enumerate(hf.compress_ratios) if int(r) == 4]
    head_dim = int(hf.head_dim)
    rows = int(req_to_token.shape[0])
    topk = int(hf.index_topk)
    hot, source = hot_slots_rule(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb, max(1, len(c4_layers)),
                                 4 * head_dim, topk, rows)
    from sgl_ess.attention.overlap import OverlapProfile
    from sgl_ess.store.engine_choice import auto_cpu_engine

    engine = auto_cpu_engine() if cfg.prefetch_engine == "auto" else cfg.prefetch_engine
    profile = None
    if cfg.prefetch_overlap_level == "full":
        if not cfg.overlap_profile:
            raise NotImplementedError("DeepSeek-V4 with ESS on: --ess-prefetch-overlap-level full needs a per-layer "
                                      "profile of this model (--ess-overlap-profile FILE); the packaged profile is "
                                      "DeepSeek-V3.2's. Use da or dba")
        profile = OverlapProfile.load(cfg.overlap_profile)
    store = C4EntryStore(c4_layers, head_dim, topk, req_to_token, pool_tokens(runner), hot,
                         warmup_queries=cfg.warmup_queries, engine=engine, overlap=cfg.prefetch_overlap_level,
                         profile=profile)
    adapter = V4EssAdapter(runner, store)
    _stores[id(runner)] = adapter
    lifecycle.register_adapter(adapter)
    logger.info("DeepSeek-V4 ESS: C4 layers %s in the host store (%d C4 locations, %d B rows), %d hot entries "
                "per request and layer (%s, %d request rows), top-k %d, %s engine, overlap %s", c4_layers,
                store.cfg.host_capacity_tokens, store.cfg.row_bytes, hot, source, rows, topk, engine,
                store.mode(c4_layers[0]) if c4_layers else "none")
    return store
