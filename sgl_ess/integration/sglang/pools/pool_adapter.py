"""Adapter between SGLang's pools/requests and ``sgl_ess.store.LatentStore``.

Memory ownership (ESS on):
  * The store's host pool (``LatentStore.host.rows`` uint8 ``[L, T, B]``) IS SGLang's latent
    pool: SGLang's DSA pool was built host-backed (host_pool_class.py: each
    ``kv_buffer[layer]`` is a view of the host rows, a zero-copy device view on CUDA), and the
    store adopts that pool. SGLang's token allocator hands out host locations,
    ``req_to_token`` is the token -> host-location map, and SGLang's radix cache shares host rows
    between requests unchanged. T = SGLang pool size + one page (its padded slots).
  * The slot space (``LatentStore.slots``: R x N hot slots per layer + the staging rings) is
    the only latent memory on the device; R = SGLang's request-pool size (``req_pool_idx``,
    index 0 is SGLang's padding).
  * The fetch engine (``--ess-prefetch-engine``: a prefetch worker process, or inline) moves
    misses host -> ring; it is stopped with the scheduler process.
  * SGLang's index-key pool (lightning-indexer keys for every token) stays on the device.

Lifecycle: ``after_extend`` opens and warms a request's hot buffer (last prefill chunk wins);
every decode step and layer, ``early_plan`` (called by the indexer as soon as a (half-)batch's
top-k exists) submits the misses' fetch and ``decode`` runs the attention with the overlap
level's schedule; ``close`` runs when SGLang frees the request row (finish, abort, retract),
``clear_locs`` when SGLang frees token pages (rows hold user data).
"""

from __future__ import annotations

import logging
import os
import threading

import torch

from sgl_ess.attention.overlap import OverlapProfile, decode_layer, layer_mode, plan_layer, split_halves
from sgl_ess.config import EssConfig
from sgl_ess.core.hot_slots import hot_slots_rule

from .graph_steps import GraphSteps, plus

logger = logging.getLogger(__name__)


def derive_hot_slots(cfg: EssConfig, topk: int, layers: int, row_bytes: int, max_requests: int) -> int:
    """Hot slots per request per layer from the ESS config (core/hot_slots.py, the rule preflight
    checked); >= topk + 1."""
    n, source = hot_slots_rule(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb, layers, row_bytes, topk,
                               max_requests)
    if n < topk + 1:
        raise ValueError(
            f"{source} gives {n} hot slots per request per layer; the model's index_topk={topk} needs "
            f">= {topk + 1} (top-k plus the newest token). Raise it or lower --max-running-requests")
    return n


def store_config(cfg: EssConfig, layers: int, row_bytes: int, topk: int, request_rows: int, max_context: int,
                 device: str, host_tokens: int, hot_buffers: int = 0, draft_tokens: int = 0,
                 layer_anchors: tuple = ()):
    """The StoreConfig of a model runner's store: `request_rows` = SGLang's request rows
    (req_to_token rows: --max-running-requests + 1; a PD decode node adds its pre-allocation rows),
    `max_context` its columns; `hot_buffers` (0: one per row) the requests that can run at once;
    `draft_tokens` the query tokens per request of an MTP forward (0: no MTP; sizes its scratch rows);
    `layer_anchors` the shared-index groups (`layer_anchors` below; () = a table per layer). Also what the GPU budget reserves before the store exists (cuda_memory.py)."""
    from sgl_ess.store import StoreConfig

    from .device_budget import verify_rows_per_request

    buffers = hot_buffers or request_rows
    hot = derive_hot_slots(cfg, topk, layers, row_bytes, buffers)
    spec = (cfg.spec_slots or max(topk, buffers * topk // 8)) if cfg.speculative_prefetch != "off" else 0
    return StoreConfig(num_layers=layers, row_bytes=row_bytes, host_capacity_tokens=host_tokens,
                       hot_slots_per_request=hot, max_requests=request_rows, topk=topk,
                       max_context_tokens=max_context, device=device, warmup_window=cfg.warmup_queries,
                       ring_slots=cfg.ring_slots, spec_slots=spec, lock_host=cfg.lock_host_memory,
                       hot_groups=hot_buffers if 0 < hot_buffers < request_rows else 0,
                       verify_rows_per_request=verify_rows_per_request(draft_tokens, topk, hot),
                       layer_anchors=tuple(layer_anchors))


def layer_anchors(hf_config, layers: int) -> tuple:
    """Per latent layer, the layer whose top-k it uses (StoreConfig.layer_anchors), read with SGLang's
    dsa_layer_skips_topk (indexer_types "shared", index_topk_freq, cli_factor) over the attention layer ids
    SGLang gives the indexer (LongCat-Flash: 2 x decoder layer + sub-layer, longcat_flash.py, the same ids
    the pool's layers have); () when every layer has its indexer, or the pool's layers are not the model's
    attention layers (an MTP draft's NextN layer)."""
    from sglang.srt.configs.model_config import dsa_layer_skips_topk, is_deepseek_dsa

    from sgl_ess.models.families import attention_layers

    arch = (list(getattr(hf_config, "architectures", None) or []) or [""])[0]
    decoder_layers = int(getattr(hf_config, "num_hidden_layers", -1))
    if not is_deepseek_dsa(hf_config) or attention_layers(arch, decoder_layers) != layers:
        return ()
    out: list[int] = []
    for i in range(layers):
        out.append(out[-1] if i > 0 and dsa_layer_skips_topk(hf_config, i) else i)
    return tuple(out) if out != list(range(layers)) else ()


def store_anchors(hf_config, layers: int, speculative: bool) -> tuple:
    """The StoreConfig.layer_anchors the store is built with: `layer_anchors` without speculative decoding;
    () with it (--speculative-algorithm: MTP verify admits rows layer by layer, so a shared-index layer
    keeps its own LRU and plans its fetch inside attention, exact but not hidden behind compute). Also what
    the launcher's --ess-explain sizes (launcher/pool_plan.store_device_bytes)."""
    return () if speculative else layer_anchors(hf_config, layers)


def speculative_on() -> bool:
    """SGLang's --speculative-algorithm is set in this process (as device_budget.draft_tokens reads it)."""
    from sglang.srt.runtime_context import get_spec

    algo = getattr(get_spec(), "speculative_algorithm", None)
    return not (algo in (None, "", "NONE") or getattr(algo, "name", algo) == "NONE")


_warned_speculative = False


def _warn_speculative_per_layer(arch: str) -> None:
    """Once per process: a shared-index model served with speculative decoding keeps per-layer LRUs."""
    global _warned_speculative
    if not _warned_speculative:
        _warned_speculative = True
        logger.warning("ESS: %s with --speculative-algorithm: shared-index layers keep their own LRU and plan "
                       "their fetch inside attention (not hidden behind compute)", arch)


def running_rows(req_pool) -> int:
    """Hot buffers a store needs for SGLang's request pool `req_pool`: on a PD decode node
    (DecodeReqToTokenPool: rows for --max-running-requests plus pre-allocated rows for requests still
    in transfer) one per running request; else 0 (one per row)."""
    pre = int(getattr(req_pool, "pre_alloc_size", 0) or 0)
    return int(req_pool.size) if pre > 0 else 0


DEFAULT_PROFILE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "attention",
                               "profiles", "default.json")


def load_profile(cfg: EssConfig) -> OverlapProfile:
    path = cfg.overlap_profile or DEFAULT_PROFILE
    prof = OverlapProfile.load(path)
    logger.info("ESS overlap level full: per-layer modes %s from %s", prof.modes, path)
    return prof


class EssPoolAdapter:
    """One per model runner (scheduler process). Thread-safe for the calls SGLang makes."""

    def __init__(self, model_runner, cfg: EssConfig):
        from sgl_ess.store import LatentStore

        from .device_budget import draft_tokens

        pool = model_runner.token_to_kv_pool
        host = getattr(pool, "ess_host_pool", None)
        if host is None:
            raise RuntimeError(
                f"ESS on, but SGLang's latent pool ({type(pool).__name__}) was not built host-backed: the "
                "sgl-ess plugin's pool hook did not run (start with python -m sgl_ess.launch_server, and do not "
                "exclude sgl_ess in SGLANG_PLUGINS)")
        mc = model_runner.model_config
        self.kv_dim = pool.kv_cache_dim               # 576 (bf16 rows) or 656 bytes (FP8 FlashMLA rows)
        self.kv_lora_rank, self.rope_dim = mc.kv_lora_rank, mc.qk_rope_head_dim
        self.dtype = pool.store_dtype                  # how the rows are stored (uint8 for FP8 rows)
        self.kv_dtype = getattr(pool, "dtype", self.dtype)  # what SGLang's kernels are handed (float8_e4m3fn)
        self.row_bytes = host.row_bytes
        self.layers = pool.layer_num
        self.topk = mc.hf_config.index_topk
        req_to_token = model_runner.req_to_token_pool.req_to_token
        max_requests = req_to_token.shape[0]
        n_draft = draft_tokens()
        # shared-index layers: one LRU slot table per group, planned at its anchor; with speculative
        # decoding each layer keeps its own LRU (store_anchors), its shared layers planned late as before
        spec = speculative_on() or n_draft > 0
        anchors = store_anchors(mc.hf_config, self.layers, spec)
        if spec and layer_anchors(mc.hf_config, self.layers) and getattr(model_runner, "tp_rank", 0) == 0:
            _warn_speculative_per_layer(mc.hf_config.architectures[0])
        self.store_cfg = store_config(cfg, self.layers, self.row_bytes, self.topk, max_requests,
                                      req_to_token.shape[1], str(model_runner.device), host.capacity_tokens,
                                      hot_buffers=running_rows(model_runner.req_to_token_pool),
                                      draft_tokens=n_draft, layer_anchors=anchors)
        # per layer: its anchor, and (at an anchor) the layers of its group; read every decode layer
        self._anchor = self.store_cfg.anchors
        self._group = {a: tuple(self.store_cfg.group_layers(a)) for a in set(self._anchor)}
        self.cfg = cfg
        # input checks read values back to the host: on the CPU once per step (layer 0), never on CUDA
        self.validate = str(model_runner.device) == "cpu"
        # DA's partial slot tables keep the full top-k width (overlap.only): the CUDA backend sets it, its
        # kernels (FlashMLA) read index_topk columns; else compacted on the CPU
        self.static_width = False
        self.level = cfg.prefetch_overlap_level
        self.profile = load_profile(cfg) if self.level == "full" else None
        from sgl_ess.store.speculative import SpeculativeOptions

        spec_options = SpeculativeOptions(cfg.predictor_checkpoint, cfg.predictor_min_precision, cfg.predictor_window)
        self.store = LatentStore(self.store_cfg, engine=cfg.prefetch_engine, speculative=cfg.speculative_prefetch,
                                 host_pool=host, spec_options=spec_options, trace_file=cfg.trace_file,
                                 trace_meta={"source": "server", "model": str(getattr(mc, "model_path", ""))})
        if self.store.device.type == "cuda":
            from .device_budget import note_store

            note_store("draft" if getattr(model_runner, "is_draft_worker", False) else "target",
                       sum(self.store_cfg.device_allocation().values()))
        self.share = getattr(pool, "ess_share", None)       # shared_host_pool.Share, or None (own pool)
        if self.share is not None:
            engine = self.store.engine
            if getattr(engine, "ordered_on_device", False):
                self.share.order_on(engine.rt)              # the owner's writes ordered by the compute streams
            elif self.store.device.type == "cuda":
                raise RuntimeError(f"ESS: a host pool shared by attention-TP ranks on CUDA is ordered by the stream "
                                   f"engine's streams; --ess-prefetch-engine {cfg.prefetch_engine} runs the "
                                   f"{engine.name} engine. Use --ess-prefetch-engine stream (or auto), or "
                                   "--ess-share-host-pool off")
        if cfg.tp_split_fetch:
            self._split_fetch()
        self.host_writer = host.writer
        # PD decode node: Mooncake / NIXL write a new request's KV into host rows directly (outside every
        # stream and every fence of ours), so a release waits for its zeroing on the host; colocated, the
        # forwards' writes are ordered after it on the device (LatentStore.clear_host / fence_host)
        mode = getattr(getattr(model_runner, "server_args", None), "disaggregation_mode", "null")
        self.store.external_host_writer = str(getattr(mode, "value", mode)) == "decode"
        self.runner_id = id(model_runner)
        self.req_pool = model_runner.req_to_token_pool
        self.allocator = model_runner.token_to_kv_pool_allocator
        self._lock = threading.RLock()
        # PD (pd_warmup.py): a decode row given to a new request waits here (row -> the prefill's warm
        # state, or None) until the first batch it runs in opens its hot buffer, warmed from that state
        # (warm starts) or cold (cold starts: no state came, or it was refused); rows still in transfer
        # hold no hot buffer
        self._pending: dict[int, tuple | None] = {}
        self.pd_opens = self.cold_starts = self.pd_warm_starts = self.pd_warm_rejected = 0
        self.pd_warm_sent = 0     # PD prefill node: warm states written for the decode node
        self.pd_wire_rows = self.pd_wire_row_bytes = 0
        self.plans_early = 0      # plans submitted by the indexer hand-off (fetch hidden behind compute)
        self.plans_late = 0       # plans made inside attention (mode none, or no hand-off)
        # the same per layer; a shared-index layer planned at its anchor (before it starts) counts early
        self.plans_early_by_layer = [0] * self.layers
        self.plans_late_by_layer = [0] * self.layers
        self._early: dict[int, tuple] = {}   # layer -> (batch key, plans, newest-token slot rows)
        # --ess-cuda-graph: SGLang may capture decode steps (backends/cuda_graph.py); ignored without CUDA
        self.graphs = GraphSteps()
        self._usage_cache: dict | None = None
        if cfg.cuda_graph and self.store.device.type == "cuda":
            self._check_graph_mode()
        if self.store.engine.synchronous and self.level != "none":
            logger.info("ESS overlap level %s: the %s prefetch engine fetches in the calling thread, so there is "
                        "nothing to overlap; decode runs as 'none' (--ess-prefetch-engine worker overlaps)",
                        self.level, self.store.engine.name)
        logger.info("ESS store: %d layers x %d host rows x %d B (host %.1f MB), hot %d slots/request x %d rows "
                    "(device %.2f MB)%s", self.layers, self.store_cfg.host_capacity_tokens, self.row_bytes,
                    self.store_cfg.host_bytes / 1e6, self.store_cfg.hot_slots_per_request, self.store_cfg.groups,
                    self.store_cfg.device_bytes / 1e6,
                    f"; {max_requests} request rows share them (PD pre-allocation)" if self.store_cfg.hot_groups else "")

    def _check_graph_mode(self) -> None:
        """--ess-cuda-graph: a device-ordered engine, and none of the options whose per-step state lives
        on the host, which a replayed graph never runs (the launcher refuses them first)."""
        cfg, engine = self.cfg, self.store.engine
        if not engine.ordered_on_device:
            raise RuntimeError(f"--ess-cuda-graph needs the stream prefetch engine (--ess-prefetch-engine stream or "
                               f"auto), not {engine.name!r}")
        host_side = {"--ess-speculative-prefetch": cfg.speculative_prefetch != "off",
                     "--ess-share-host-pool on": self.share is not None,
                     "--ess-trace-file": bool(cfg.trace_file)}
        for flag, on in host_side.items():
            if on:
                raise RuntimeError(f"--ess-cuda-graph with {flag}: its per-step state lives on the host, which a "
                                   "replayed graph never runs; drop one of them")

    def _split_fetch(self) -> None:
        """--ess-tp-split-fetch: this rank reads its share of each step's misses; the attention-TP group
        all-gathers them (prefetch/split_fetch.py). Ignored with attention TP 1."""
        from sglang.srt.distributed.parallel_state import get_attn_tp_group

        from sgl_ess.prefetch.split_fetch import SplitFetch, torch_all_gather

        group = get_attn_tp_group()
        if group.world_size <= 1:
            logger.info("--ess-tp-split-fetch: attention TP 1, nothing to split")
            return
        pg = group.device_group if self.store.device.type == "cuda" else group.cpu_group
        self.store.engine = SplitFetch(self.store.engine, group.rank_in_group, group.world_size, torch_all_gather(pg))
        logger.info("ESS --ess-tp-split-fetch: attention-TP rank %d of %d reads 1/%d of each step's misses from host "
                    "memory; the group all-gathers them", group.rank_in_group, group.world_size, group.world_size)

    # --- per forward ------------------------------------------------------------------
    def after_extend(self, layer: int, rows: list[int], seq_lens: list[int], n_q: list[int],
                     topk: torch.Tensor, req_to_token: torch.Tensor) -> None:
        """Prefill chunk done for `layer`: (re)open hot buffers and warm them from the last W queries
        (W = --ess-warmup-queries; 0 opens them cold)."""
        w = self.store_cfg.warmup_window
        if w <= 0:
            if layer == 0:
                with self._lock:
                    for row in rows:
                        self.store.open(row)
            return
        k = topk.shape[1]
        ids = torch.full((len(rows), w, k), -1, dtype=topk.dtype, device=topk.device)
        start = 0
        for i, n in enumerate(n_q):
            m = min(n, w)
            ids[i, w - m:] = topk[start + n - m: start + n]   # oldest first, -1 rows in front
            start += n
        r = torch.tensor(rows, dtype=torch.int64)
        s = torch.tensor(seq_lens, dtype=torch.int64)
        with self._lock:
            if layer == 0:
                for row in rows:
                    self.store.open(row)
            self.store.warmup(layer, r, s, ids, req_to_token, validate=self.validate)   # CUDA: no check, no read

    def mode(self, layer: int) -> str:
        return layer_mode(self.level, layer, self.profile, self.layers, synchronous=self.store.engine.synchronous)

    def set_level(self, level: str) -> None:
        """Switch the overlap level (runtime_config.py); 'full' loads the profile on first use."""
        with self._lock:
            if level == "full" and self.profile is None:
                self.profile = load_profile(self.cfg)
            logger.info("ESS overlap level %s -> %s", self.level, level)
            self.level = level

    def early_parts(self, layer: int, batch_size: int) -> list[slice]:
        """How the indexer should hand over its top-k: one slice per plan ([] for mode 'none')."""
        mode = self.mode(layer)
        if mode == "none":
            return []
        return split_halves(batch_size) if mode == "dba" else [slice(0, batch_size)]

    def early_plan(self, batch_key: int, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor,
                   topk: torch.Tensor, req_to_token: torch.Tensor, part: int, padded: bool = False) -> None:
        """Called by the indexer as soon as the top-k of slice `part` of the decode batch exists
        (see `early_parts`): reserve the newest tokens' slots and submit the misses' fetch, so it
        hides behind the rest of the layer's compute (and, for DBA, the other half's indexer).
        `batch_key` identifies the forward batch; `decode` uses the plans only for that batch.
        `padded`: `reqs` holds -1 for SGLang's padding rows (a CUDA graph's batch): they touch nothing."""
        with self._lock:
            if self._shared_layer(layer):
                if self._early.get(layer, (None,))[0] == batch_key:
                    return                         # planned with its group at the anchor
                raise RuntimeError(f"ESS: layer {layer} reuses layer {self._anchor[layer]}'s top-k "
                                   "(a shared-index layer) but its group was not planned at the anchor")
            check = self.validate and layer == 0
            self._plan_group(batch_key, layer, reqs, seq_lens, topk, req_to_token, part, check, padded)
            self.plans_early += 1
            self.plans_early_by_layer[layer] += 1

    def _shared_layer(self, layer: int) -> bool:
        return self._anchor[layer] != layer

    def _plan_group(self, batch_key, anchor, reqs, seq_lens, topk, req_to_token, part, check, padded) -> None:
        """Reserve the newest rows and plan the fetch of every layer of `anchor`'s group (one layer
        without shared-index layers), one resolver call; kept per layer in `_early` for `decode`."""
        layers = self._group[anchor]
        for layer in layers:
            if self._early.get(layer, (None,))[0] != batch_key:   # plans of an abandoned forward: never reused
                self._discard_early(layer)
                self._early[layer] = (batch_key, [], [])
        if len(layers) == 1:
            rows = [self.store.reserve(anchor, reqs, seq_lens - 1, validate=check, padded=padded)]
            steps = [self.store.plan(anchor, reqs, seq_lens, topk, req_to_token, micro_batch=part,
                                     validate=check, padded=padded)]
        else:
            rows = self.store.reserve_group(anchor, reqs, seq_lens - 1, validate=check, padded=padded)
            steps = self.store.plan_group(anchor, reqs, seq_lens, topk, req_to_token, micro_batch=part,
                                          validate=check, padded=padded)
        for layer, r, st in zip(layers, rows, steps):
            self._early[layer][1].append(st)
            self._early[layer][2].append(r)
            if layer != anchor:
                self.plans_early_by_layer[layer] += 1

    def _discard_early(self, layer: int) -> None:
        old = self._early.pop(layer, None)
        if old:
            for step in old[1]:
                self.store.commit(step)            # land and commit: the LRU state already counts them

    def decode(self, batch_key: int, layer: int, q3: torch.Tensor, reqs: torch.Tensor, seq_lens: torch.Tensor,
               topk: torch.Tensor, newest: torch.Tensor, req_to_token: torch.Tensor, attend,
               single_call: bool = False, padded: bool = False) -> torch.Tensor:
        """One layer's decode attention over the store. q3 [b, H, D]; newest [b, kv_dim] (the
        step's new latent rows, cache dtype); returns out float [b, H, R]. `single_call`: `attend`
        must see the whole batch in one call and returns no log-sum-exp (SGLang's FlashMLA wrapper),
        so the attention runs once after the fetch landed whatever the level. `padded`: `reqs` holds
        -1 for SGLang's padding rows (a captured CUDA graph's batch); the last layer of such a step
        joins its side-stream work back into the compute stream (store.graph_boundary)."""
        mode = "none" if single_call else self.mode(layer)
        check = self.validate and layer == 0
        data = newest.contiguous().view(torch.uint8).reshape(newest.shape[0], self.row_bytes)
        with self._lock:
            early = self._early.get(layer)
            if early is not None and early[0] != batch_key:
                self._discard_early(layer)
                early = None
            if early is None and self._shared_layer(layer):
                raise RuntimeError(f"ESS: decode of shared-index layer {layer} found no plan made at its anchor "
                                   f"(layer {self._anchor[layer]})")
            if early is None and len(self._group[layer]) > 1:
                # an anchor planned inside attention: plan its whole group now (one resolver call per DBA
                # half); the shared-index layers after it find their plans made (early for them)
                parts = split_halves(reqs.numel()) if mode == "dba" else [slice(0, reqs.numel())]
                for i, sl in enumerate(parts):
                    self._plan_group(batch_key, layer, reqs[sl], seq_lens[sl], topk[sl], req_to_token, i, check,
                                     padded)
                self.plans_late += len(parts)
                self.plans_late_by_layer[layer] += len(parts)
                early = self._early.get(layer)
            self._early.pop(layer, None)
            if early is None:
                rows = self.store.reserve(layer, reqs, seq_lens - 1, validate=check, padded=padded)
                self.store.write_slots(rows, data, padded=padded)
                plans = plan_layer(self.store, mode, layer, reqs, seq_lens, topk, req_to_token, validate=check,
                                   padded=padded)
                self.plans_late += len(plans)
                self.plans_late_by_layer[layer] += len(plans)
            else:
                _, plans, rows = early
                self.store.write_slots(rows[0] if len(rows) == 1 else torch.cat(rows), data, padded=padded)
            out = decode_layer(self.store, mode, q3, plans, attend, static_width=self.static_width)
            if padded and layer == self.layers - 1:
                self.store.graph_boundary()     # a captured step ends with its side-stream work joined
            return out

    # --- decode CUDA graphs (cuda_graph.py, graph_steps.py) -----------------------------
    def graph_capture_batch(self, size: int) -> None:
        """SGLang starts the warm-ups and capture of a decode graph of `size` rows. Checked here as
        well as at launch: SGLang can turn decode graphs on by itself (a PD role switch)."""
        with self._lock:
            self._end_capture()
            if self.store.device.type == "cuda":
                self._check_graph_mode()
            self.graphs.begin_capture(size)

    def graph_capture(self) -> None:
        """After each of SGLang's warm-up runs of a capture batch (the capture may come next): order
        everything eager before it, keep no ticket the capture could wait on."""
        with self._lock:
            for layer in list(self._early):
                self._discard_early(layer)     # a warm-up run's plans (padding rows only: nothing moves)
            self.store.graph_boundary()
            self.graphs.before_capture(self._host_counts())

    def graph_replay(self, rows: list[int] | None, size: int, n_real: int) -> None:
        """Before SGLang replays the decode graph of `size` rows with `n_real` real ones (`rows`: their
        request rows, read only when a PD decode node has rows waiting to open): open those hot
        buffers, order pending eager work (zeroing of released rows, prefill warmups, commits)
        before the graph, and count what the replay does that no Python sees."""
        if rows is not None and self.has_pending():
            self.open_pending(rows)
        with self._lock:
            self._end_capture()
            self.store.graph_boundary()
            self._set_counts(plus(self._host_counts(), self.graphs.replay(size, n_real)))
        # every layer's writer stored the real rows (MTP verify: n per request): one add, not one per layer
        self.store.counters.add_d2h_every_layer(n_real * self.graphs.width(size))

    def end_capture(self) -> None:
        """An eager forward: any capture's run is over."""
        if self.graphs.capturing:
            with self._lock:
                self._end_capture()

    def _end_capture(self) -> None:
        before = self.graphs.close(self._host_counts())
        if before is not None:                 # the capture's run moved no device: its counts go
            self._set_counts(before)

    def _host_counts(self) -> dict:
        tiers = self.store.engine.tiers.data
        counts = {"plans_early": self.plans_early, "plans_late": self.plans_late,
                  "mtp_steps": getattr(self, "mtp_steps", 0),
                  "early_by_layer": dict(enumerate(self.plans_early_by_layer)),
                  "late_by_layer": dict(enumerate(self.plans_late_by_layer)),
                  "resolver_calls": self.store.resolver_calls,
                  "tiers": {t: tiers[t]["plans"] for t in tiers}}
        if hasattr(self.store.engine, "graph_counts"):       # --ess-tp-split-fetch: its exchanges
            counts["engine"] = self.store.engine.graph_counts()
        return counts

    def _set_counts(self, c: dict) -> None:
        self.plans_early, self.plans_late = c["plans_early"], c["plans_late"]
        if getattr(self, "_mtp_rows", None) is not None:
            self.mtp_steps = c["mtp_steps"]
        self.plans_early_by_layer = [c["early_by_layer"][i] for i in range(self.layers)]
        self.plans_late_by_layer = [c["late_by_layer"][i] for i in range(self.layers)]
        self.store.resolver_calls = c["resolver_calls"]
        for t, n in c["tiers"].items():
            self.store.engine.tiers.data[t]["plans"] = n
        if "engine" in c:
            self.store.engine.set_graph_counts(c["engine"])


    def latent_layout(self):
        """The rows' LatentLayout (for the Triton decode kernel and the torch reference)."""
        from sgl_ess.kernels.latent_layout import LatentLayout

        r, p = self.kv_lora_rank, self.rope_dim
        fp8 = LatentLayout("fp8_flashmla", r, p) if r % 128 == 0 else None
        if fp8 is not None and self.row_bytes == fp8.row_bytes:
            return fp8
        kind = {2: "bf16", 4: "fp32"}.get(self.dtype.itemsize)
        if kind is None or self.row_bytes != (r + p) * self.dtype.itemsize:
            raise ValueError(f"ESS: latent rows of {self.row_bytes} B ({self.dtype}) match no known layout "
                             f"(FP8 FlashMLA {r}+{p}, BF16, FP32)")
        return LatentLayout(kind, r, p)

    def as_kv_cache(self, slot_rows: torch.Tensor) -> torch.Tensor:
        """[S, 1, kv_cache_dim] view of slot rows as SGLang's kernels get its own cache: in the pool's
        logical dtype (an FP8 pool stores uint8 rows and hands FlashMLA float8_e4m3fn views, as
        SGLang's MLA pool's get_key_buffer does)."""
        return slot_rows.view(self.kv_dtype).view(-1, 1, self.kv_dim)

    # --- speculative decoding (EAGLE / NextN): sgl_ess/store/verify.py ----------------------
    def _committed_rows(self):
        if getattr(self, "_mtp_rows", None) is None:
            from sgl_ess.store.verify import CommittedRows

            self._mtp_rows = CommittedRows(self.layers, self.store_cfg.max_requests, self.store.device)
            self.mtp_steps = 0          # MTP forwards (target verify, draft extend) x layers
            self.mtp_window_entries = 0  # entries read from the forward's own rows (host)
            self.mtp_overflow_entries = 0  # committed entries past the hot buffer, read from host
        return self._mtp_rows

    def mtp_reset(self, layer: int, rows: list[int], committed: list[int]) -> None:
        """After a prefill chunk: rows below `committed` are final and already offered to the
        hot buffer (warmup), so later MTP steps admit only newer ones."""
        with self._lock:
            self._committed_rows().reset(layer, torch.tensor(rows, dtype=torch.int64),
                                         torch.tensor(committed, dtype=torch.int64))

    def admit_committed(self, layer: int, reqs: torch.Tensor, committed: torch.Tensor, req_to_token: torch.Tensor,
                        max_rows: int, padded: bool = False) -> torch.Tensor:
        """Admit the rows that became final since each request's last step (accepted draft
        tokens) as its most recently used entries. reqs/committed int64 [b] (`padded`: -1 rows
        are SGLang's padding in a captured CUDA graph's batch and admit nothing)."""
        with self._lock:
            return self._committed_rows().admit(self.store, layer, reqs, committed, req_to_token, max_rows,
                                                padded=padded)

    def verify(self, layer: int, reqs: torch.Tensor, committed: torch.Tensor, topk: torch.Tensor,
               req_to_token: torch.Tensor, attend_rows, micro_batch: int = 0, attend_slots=None,
               padded: bool = False) -> torch.Tensor:
        """One layer of an MTP forward (TARGET_VERIFY, DRAFT_EXTEND_V2): the rows that became
        final since the last step are admitted, then the n top-k rows of each request resolve as
        one union set; window and overflow entries are read from the host pool.
        reqs/committed int64 [b]; topk int [b, n, k] positions;
        attend_rows(rows [b*n, k, kv_dim] cache dtype, valid bool [b*n, k]) -> out; or, given,
        attend_slots(slot_rows, slots int32 [b*n, k]) -> out: a kernel reading the slot space by slot
        (window and overflow rows in its MTP scratch rows: store/verify_slots.py), no row copy.
        `padded`: `reqs` holds -1 for SGLang's padding rows (a captured CUDA graph's batch, by slot
        only): they touch nothing, and the last layer joins the side streams (store.graph_boundary)."""
        from sgl_ess.store.verify import gather_rows, plan_union

        if padded and attend_slots is None:
            raise RuntimeError("ESS: a captured MTP verify step reads its union by slot (attend_slots)")
        with self._lock:
            self._committed_rows()
            self.admit_committed(layer, reqs, committed, req_to_token, topk.shape[1], padded=padded)
            plan = plan_union(self.store, layer, reqs, committed, topk, req_to_token, micro_batch=micro_batch,
                              validate=self.validate and layer == 0 and not padded, padded=padded)
            self.store.land(plan.step)
            if attend_slots is not None:
                from sgl_ess.store.verify_slots import slot_table

                out = attend_slots(self.store.slot_rows, slot_table(self.store, plan, layer, reqs, committed, topk,
                                                                    req_to_token, padded=padded))
            else:
                rows, valid = gather_rows(self.store, plan, layer)
                out = attend_rows(rows.view(self.dtype).view(rows.shape[0], rows.shape[1], self.kv_dim), valid)
            self.store.commit(plan.step)
            self.mtp_steps += 1
            self.mtp_window_entries += plan.window.sum()       # device counts: read by path_usage only
            self.mtp_overflow_entries += plan.overflow.sum()
            if padded and layer == self.layers - 1:
                self.store.graph_boundary()     # a captured step ends with its side-stream work joined
            return out

    def decode_committed(self, batch_key: int, layer: int, q3: torch.Tensor, reqs: torch.Tensor,
                         seq_lens: torch.Tensor, topk: torch.Tensor, req_to_token: torch.Tensor, attend,
                         max_admit: int, micro_batch_base: int = 0, single_call: bool = False,
                         padded: bool = False) -> torch.Tensor:
        """A decode step that reads only final rows (positions < seq_lens): an EAGLE draft step,
        whose own newest row is speculative and is neither read nor admitted. q3 [b, H, D];
        topk int [b, k] (< seq_lens); returns out float [b, H, R]. `single_call` as in `decode`.
        An early plan of this batch (an indexer hook that did not ask accepts_early_plans) has
        already reserved the speculative row's slot: refused, as reading it would read an empty row.
        `padded`: `reqs` holds -1 for SGLang's padding rows (a captured CUDA graph's batch): they touch
        nothing, and the last layer joins the side streams (store.graph_boundary)."""
        mode = "none" if single_call else self.mode(layer)
        with self._lock:
            early = self._early.get(layer)
            if early is not None and early[0] == batch_key:
                raise RuntimeError(
                    f"ESS: layer {layer} of an EAGLE draft step was planned early by the indexer hand-off, which "
                    "reserved each request's speculative newest row as resident; the draft step never writes it. "
                    "The attention backend must say accepts_early_plans = False for draft steps "
                    "(query_layout.accepts_early_plans)")
            if early is not None:
                self._discard_early(layer)         # an abandoned forward's plans: land and commit them
            self._committed_rows()
            self.admit_committed(layer, reqs, seq_lens, req_to_token, max_admit, padded=padded)
            plans = plan_layer(self.store, mode, layer, reqs, seq_lens, topk, req_to_token,
                               validate=self.validate and layer == 0 and not padded,
                               micro_batch_base=micro_batch_base, padded=padded)
            self.plans_late += len(plans)
            out = decode_layer(self.store, mode, q3, plans, attend, static_width=self.static_width)
            if padded and layer == self.layers - 1:
                self.store.graph_boundary()     # a captured step ends with its side-stream work joined
            return out

    def note_host_write(self, layer: int, rows: int) -> None:
        """SGLang's writer stored `rows` new latent rows of `layer` straight into the host pool (on
        CUDA through the zero-copy view: device -> host bytes the store's own writes do not see)."""
        self.store.counters.add_d2h(layer, rows)

    def note_mixed_decode(self, rows: int) -> None:
        """Running requests served by the decode path inside a mixed chunked-prefill batch."""
        self.mixed_decode_rows = getattr(self, "mixed_decode_rows", 0) + rows

    def path_usage(self) -> dict:
        """Counters of the MTP (verify, draft extend), mixed-batch and decode-graph paths (empty until
        one runs)."""
        out = {}
        if getattr(self, "mixed_decode_rows", 0):
            out["mixed_decode_rows"] = self.mixed_decode_rows
        out.update(self.graphs.usage())
        if getattr(self, "_mtp_rows", None) is None:
            return out
        return {**out, "mtp_steps": self.mtp_steps, "mtp_rows_admitted": self._mtp_rows.rows_admitted,
                "mtp_window_entries": int(self.mtp_window_entries),
                "mtp_overflow_entries": int(self.mtp_overflow_entries)}

    def is_open(self, req: int) -> bool:
        return self.store.is_open(req)

    def as_latent(self, slot_rows: torch.Tensor) -> torch.Tensor:
        """[S, kv_dim] view of slot rows (uint8) in the cache dtype."""
        return slot_rows.view(self.dtype).view(-1, self.kv_dim)

    def fence_host(self, layer: int | None = None) -> None:
        """Before SGLang writes latent rows (of `layer`; None: any): order the write after the
        zeroing of released rows (layer by layer on a device stream; already done on a PD decode node)."""
        with self._lock:
            self.store.fence_host(layer)

    # --- lifecycle --------------------------------------------------------------------
    def note_rows_allocated(self, rows: list[int]) -> None:
        """A PD decode node gave these rows to new requests whose KV arrives by transfer (no extend
        runs here): each opens, cold unless the transfer brings a warm state, when it first runs."""
        with self._lock:
            for r in rows:
                if 0 <= r < self.store_cfg.max_requests:
                    self.store.close(r)            # nothing of a previous owner of the row survives
                    self._pending[r] = None

    def is_pending(self, row: int) -> bool:
        return row in self._pending

    def has_pending(self) -> bool:
        return bool(self._pending)

    def open_pending(self, rows: list[int]) -> None:
        """The forward batch about to run holds request rows `rows`: open (and warm) those that run for
        the first time here."""
        with self._lock:
            for r in rows:
                if r not in self._pending:
                    continue
                state = self._pending.pop(r)
                self.store.open(r)
                self.pd_opens += 1
                if state is not None:
                    self._warm(r, *state)

    def debug_zero_rows(self, row: int, seq_len: int) -> None:
        """Zero request row `row`'s first `seq_len` latent host rows (pd_warmup's debug stand-in for a
        transfer that skipped the latent write)."""
        with self._lock:
            self.store.clear_host(self.req_pool.req_to_token[row, :seq_len].to(torch.int64))
            self.store.fence_host()

    def export_warm_state(self, row: int) -> torch.Tensor:
        """PD prefill node: request row `row`'s LRU state as tokens [L, N] (pd_warmup.encode)."""
        with self._lock:
            return self.store.lru_tokens(row)

    def import_warm_state(self, row: int, seq_len: int, got, counted: bool = True) -> None:
        """PD decode node, transfer committed: `got` is pd_warmup.decode's answer, (seq_len, tokens
        [L, N]) or the reason there is none. Kept until the row first runs (open_pending), which warms
        its hot buffer from it, else counts a cold start (`counted` False: a health check, not counted
        either way)."""
        with self._lock:
            if row in self._pending:        # pd_warmup.decode's tokens are a copy: the wire row is reused
                self._pending[row] = (seq_len, got, counted)

    def _warm(self, row: int, seq_len: int, got, counted: bool) -> None:
        """Open row `row`'s hot buffer warm from the transferred state `got` (see import_warm_state)."""
        if isinstance(got, str):
            if not counted:
                return
            if got != "absent":
                self.pd_warm_rejected += 1
                logger.warning("PD warm state refused for request row %d: %s; it starts cold", row, got)
            self.cold_starts += 1
            return
        sent_len, tokens = got
        fetched = None
        if sent_len == seq_len:
            fetched = self.store.warm_from_lru_tokens(row, seq_len, tokens, self.req_pool.req_to_token)
        if fetched is None:
            if not counted:
                return
            self.pd_warm_rejected += 1
            self.cold_starts += 1
            logger.warning("PD warm state refused for request row %d: not a valid LRU state for its %d "
                           "tokens (the prefill sent %d); it starts cold", row, seq_len, sent_len)
            return
        self.pd_warm_starts += int(counted)

    def close_rows(self, rows: list[int]) -> None:
        with self._lock:
            for r in rows:
                if 0 <= r < self.store_cfg.max_requests:
                    self._pending.pop(r, None)
                    self.store.close(r)

    def clear_locs(self, locs: torch.Tensor) -> None:
        if not self.host_writer:         # a node's shared pool: its owner rank zeroes released rows
            return
        with self._lock:
            self.store.clear_host(locs.reshape(-1).long())

    def shutdown(self) -> None:
        with self._lock:
            self.store.shutdown()

    def usage(self) -> dict:
        """A snapshot of the store (taken under the adapter's lock: the metrics thread calls this
        while the scheduler thread plans and commits)."""
        with self._lock:
            if self.graphs.capturing and self._usage_cache is not None:
                return dict(self._usage_cache)   # no device read while SGLang may be capturing a graph
            self._usage_cache = self._usage()
            return dict(self._usage_cache)

    def _usage(self) -> dict:
        # SGLang's allocator hands out the host locations: its used size is the host usage.
        used = None if self.allocator is None else int(self.allocator.size - self.allocator.available_size())
        u = dict(self.store.usage(host_tokens_used=used))
        snap = self.store.counters.snapshot()
        u.update(hit_rate=snap["hit_rate"], rows_h2d=sum(snap["rows_h2d"]), warmup_rows=sum(snap["warmup_rows"]),
                 refetch_rows=sum(snap["refetch_rows"]), hot_slots_per_request=self.store_cfg.hot_slots_per_request,
                 overlap_level=self.level, overlap_runs_as="none" if self.store.engine.synchronous else self.level,
                 plans_early=self.plans_early, plans_late=self.plans_late, cold_starts=self.cold_starts,
                 plans_early_by_layer=list(self.plans_early_by_layer),
                 plans_late_by_layer=list(self.plans_late_by_layer), resolver_calls=self.store.resolver_calls,
                 hot_buffers=self.store_cfg.groups, request_rows=self.store_cfg.max_requests,
                 pd_pending_rows=len(self._pending),
                 pd_opens=self.pd_opens, pd_warm_starts=self.pd_warm_starts, pd_warm_rejected=self.pd_warm_rejected,
                 pd_warm_sent=self.pd_warm_sent, pd_wire_rows=self.pd_wire_rows,
                 pd_wire_row_bytes=self.pd_wire_row_bytes,
                 misses_per_layer=snap["layer_misses"], hits_per_layer=snap["layer_hits"],
                 bytes_h2d=snap["bytes_h2d"], bytes_d2h=snap["bytes_d2h"])
        u.update(self.path_usage())
        if self.share is not None:
            u.update(self.share.describe())
        split = u["prefetch"].get("split_fetch")
        if split is not None:
            u["split_fetch"] = split
        return u

