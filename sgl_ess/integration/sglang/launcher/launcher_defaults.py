"""What ``python -m sgl_ess.launch_server`` adds to the user's SGLang flags, and how the token
pool is sized. Everything here runs before the model loads; the model's config is read through
transformers (model_config.py).

The host pool and hot buffers are sized per node by pool_plan.py (read it for the rules: an explicit
--ess-memory-pool-size-gb is the node's budget, split over its host pools; with nothing set a GPU
node gives its usable host memory, a CPU one 65536 tokens per pool, each named as a default).
With ``--ess-lock-host-memory`` the bytes each process will mlock (host pool, and on CPU the slot
space) are checked against RLIMIT_MEMLOCK (sgl_ess.serving.preflight.check_memlock).
The result is exported as ``SGLESS_POOL_SIZING`` and shown by /ess/status next to the bytes
each scheduler really allocated.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Optional

from sgl_ess.config import EssConfig
from sgl_ess.models import TINY_DSV32_DIR
from sgl_ess.serving.preflight import DSA_PAGE_SIZE, PreflightError, check_memlock, locked_bytes, slot_space_bytes

from . import pool_plan
from .argv_view import flag_value, has_flag, int_flag, parallel_layout
from .node_devices import NodeDevices

logger = logging.getLogger("sgl_ess")

DEFAULT_PORT = 30000
DEFAULT_MAX_RUNNING_REQUESTS = 64
EMBEDDED_MODEL_NAME = "tiny_dsv32"


def fill_defaults(argv: list[str], cfg: EssConfig, has_cuda: bool, devices: Optional[NodeDevices] = None,
                  geometry: pool_plan.GeometryReader = pool_plan.read_geometry) -> tuple[list[str], dict]:
    """(argv for SGLang with the launcher's defaults, pool sizing). `argv`: SGLang's flags under their full
    names (sglang_flags.canonical_argv); `devices`: the node planned for (default: CPU, or CUDA of
    unknown count and memory); `geometry`: reads the model's geometry (model_config.py). Raises
    PreflightError."""
    out = list(argv)
    eng = cfg.engine
    if not has_flag(out, "--model-path"):
        model = eng.get("model_name") or TINY_DSV32_DIR
        out += ["--model-path", model]
        if model == TINY_DSV32_DIR:
            if not has_flag(out, "--load-format"):
                out += ["--load-format", "dummy"]
                os.environ.setdefault("SGLESS_DUMMY_INIT", "scaled")
            if not has_flag(out, "--served-model-name"):
                out += ["--served-model-name", EMBEDDED_MODEL_NAME]   # not a server path in /v1/models
    if not has_flag(out, "--host"):
        out += ["--host", "127.0.0.1"]
    if not has_flag(out, "--port"):
        out += ["--port", str(DEFAULT_PORT)]
    if not has_cuda and not has_flag(out, "--device"):
        out += ["--device", "cpu"]
    if not has_cuda and not has_flag(out, "--sleep-on-idle"):
        out += ["--sleep-on-idle"]   # an idle CPU scheduler otherwise spins a core
    if not has_flag(out, "--attention-backend"):
        # CPU: the ess torch backend (ESS on or off); CUDA: SGLang's dsa, which sgl-ess extends with
        # ESS when it is on (cuda_backend.py)
        out += ["--attention-backend", "dsa" if has_cuda else "ess"]
    if has_cuda and cfg.enabled:
        out = cuda_ess_defaults(out, graphs=cfg.cuda_graph)
        if cfg.cuda_graph and decode_graphs_on(out):
            check_cuda_graph(out, cfg, os.environ)
    elif cfg.cuda_graph and cfg.enabled:
        logger.info("--ess-cuda-graph: no CUDA here, nothing to capture (ignored)")
    if not has_flag(out, "--max-running-requests"):
        out += ["--max-running-requests", str(eng.get("decode_batch_size", DEFAULT_MAX_RUNNING_REQUESTS))]
    if has_flag(out, "--enable-deterministic-inference") and not has_flag(out, "--disable-radix-cache"):
        # prefix-cached extends are not bit-identical to full prefills on the CPU torch path
        out += ["--disable-radix-cache"]
        logger.warning("--enable-deterministic-inference: adding --disable-radix-cache (a prefix-cached "
                       "request is not bit-identical to the same request computed whole)")
    out = dp_balance_default(out, cfg.enabled)
    workers = int_flag(out, "--tokenizer-worker-num")
    if workers is not None and workers > 1:
        raise PreflightError(f"--tokenizer-worker-num {workers}: sgl_ess.launch_server's request guard and "
                             f"admission run in the one HTTP process; expected 1")
    if cfg.enabled and has_cuda and cfg.share_host_pool == "on" and cfg.prefetch_engine not in ("auto", "stream"):
        raise PreflightError(f"--ess-share-host-pool on with --ess-prefetch-engine {cfg.prefetch_engine}: on CUDA the "
                             "ranks sharing a host pool are ordered by the stream engine's streams; use "
                             "--ess-prefetch-engine stream (or auto), or --ess-share-host-pool off")
    sizing, geo = pool_plan.plan(out, cfg, devices or NodeDevices("cuda" if has_cuda else "cpu", source="has_cuda"),
                                 geometry)
    if cfg.lock_host_memory:
        check_lock(cfg, geo, sizing, running=int_flag(out, "--max-running-requests"), has_cuda=has_cuda)
    return out, sizing


def check_lock(cfg: EssConfig, geo, sizing: dict, running: int, has_cuda: bool) -> None:
    """--ess-lock-host-memory: refuse it with ESS off (there is no ESS host memory to lock), and refuse
    bytes above RLIMIT_MEMLOCK."""
    if not cfg.enabled:
        raise PreflightError("--ess-lock-host-memory needs ESS on: with --ess-enabled false the latent cache is "
                             "SGLang's own pool, which sgl-ess does not allocate; drop one of the two flags")
    if geo is None:
        logger.info("--ess-lock-host-memory: the model's config has no MLA latent, so the bytes to lock are "
                    "checked when the store is built, not before the model loads")
        return
    host = sizing["host_bytes_expected"]
    slots, what = 0, f"host pool {host} B"
    if not has_cuda and sizing.get("hot_slots_per_request") and geo.index_topk:
        k, rows = geo.index_topk, running + 1            # SGLang keeps one padding request row
        spec = (cfg.spec_slots or max(k, rows * k // 8)) if cfg.speculative_prefetch != "off" else 0
        slots = slot_space_bytes(geo.layers, geo.latent_row_bytes, rows, sizing["hot_slots_per_request"], k,
                                 cfg.ring_slots, spec)
        what += f" + slot space {slots} B, in whole pages"
    sizing["locked_bytes_expected"] = locked_bytes(host, slots)
    check_memlock(sizing["locked_bytes_expected"], what)


def dp_balance_default(argv: list[str], ess_on: bool) -> list[str]:
    """ESS on, DP > 1, colocated, no --load-balance-method: SGLang's ``total_tokens`` (its default is
    round robin). Each DP rank's token pool IS its ESS host pool and every rank's pool has the same size,
    so the rank with the fewest rows in use (plus queued prompts) is the one with the most free host rows:
    the DP controller then dispatches by free host pool. A prefill node keeps SGLang's
    ``follow_bootstrap_room`` (PD needs it); a decode node keeps SGLang's default (not tested with DP)."""
    lay = parallel_layout(argv)
    mode = flag_value(argv, "--disaggregation-mode") or "null"
    if not ess_on or lay["dp"] <= 1 or mode != "null" or has_flag(argv, "--load-balance-method"):
        return argv
    logger.info("ESS with --dp %d: --load-balance-method total_tokens (requests go to the DP rank with the "
                "most free host-pool rows; set --load-balance-method to choose)", lay["dp"])
    return [*argv, "--load-balance-method", "total_tokens"]


ENV_TRUE = ("true", "1", "yes", "y")     # SGLang's EnvBool (srt/environ.py); the contract test checks it
GRAPH_DECODE_BACKENDS = ("full", "disabled")   # what --ess-cuda-graph captures: whole steps, or none


def cuda_ess_defaults(argv: list[str], graphs: bool = False) -> list[str]:
    """ESS on a GPU: FP8 656-byte rows decoded by FlashMLA over the slot table, 64-token pages, and
    CUDA graphs off in SGLang 0.5.23's spelling, ``--cuda-graph-backend-{decode,prefill} disabled`` (it
    deprecates ``--disable-cuda-graph``, and its per-phase flags override that one). `graphs`
    (--ess-cuda-graph): decode graphs are SGLang's to choose, whole steps only (``full``); prefill
    graphs stay off. Without it a decode graph flag of the user's is refused: the eager ESS step reads
    the batch's padding on the host, which a capture would freeze."""
    out = list(argv)
    if not has_flag(out, "--kv-cache-dtype"):
        out += ["--kv-cache-dtype", "fp8_e4m3"]
    if not has_flag(out, "--dsa-decode-backend") and flag_value(out, "--kv-cache-dtype") == "fp8_e4m3":
        out += ["--dsa-decode-backend", "flashmla_kv"]
    if not has_flag(out, "--page-size"):
        out += ["--page-size", str(DSA_PAGE_SIZE)]
    if has_flag(out, "--cuda-graph-config"):
        raise PreflightError("--cuda-graph-config with ESS on CUDA: sgl-ess cannot tell which phases it captures; "
                             "use --cuda-graph-backend-decode with --ess-cuda-graph true (decode graphs), or drop it")
    legacy_off = has_flag(out, "--disable-cuda-graph")
    prefill = flag_value(out, "--cuda-graph-backend-prefill")
    if prefill not in (None, "disabled"):
        raise PreflightError(f"--cuda-graph-backend-prefill {prefill} with ESS on CUDA: ESS prefill is not captured "
                             "(only decode steps are, with --ess-cuda-graph true); drop the flag")
    if prefill is None and not legacy_off:
        out += ["--cuda-graph-backend-prefill", "disabled"]
    decode = flag_value(out, "--cuda-graph-backend-decode")
    if not graphs:
        if decode not in (None, "disabled"):
            raise PreflightError(f"--cuda-graph-backend-decode {decode} with ESS on CUDA needs --ess-cuda-graph true "
                                 "(decode graphs with ESS, never yet run on a GPU); or drop the flag to run eager")
        if decode is None and not legacy_off:
            out += ["--cuda-graph-backend-decode", "disabled"]
        return out
    if decode not in (None, *GRAPH_DECODE_BACKENDS):
        raise PreflightError(f"--cuda-graph-backend-decode {decode} with --ess-cuda-graph: ESS decode steps are "
                             "captured whole (full); a breakable or piecewise graph runs attention outside the "
                             "graph while the indexer's fetch forks streams inside it. Use full, or drop the flag")
    if decode_graphs_on(out):
        logger.warning("--ess-cuda-graph: SGLang captures ESS decode steps in CUDA graphs; this has been checked on "
                       "CPU by a graph double only, never captured on a GPU (drop the flag to run eager)")
    else:
        logger.info("--ess-cuda-graph has no effect: decode CUDA graphs are disabled (%s)",
                    "--cuda-graph-backend-decode disabled" if decode else "--disable-cuda-graph")
    return out


def decode_graphs_on(argv: list[str]) -> bool:
    """SGLang will capture decode graphs: its per-phase flag says so, or neither it nor the legacy
    --disable-cuda-graph turns them off (SGLang's default)."""
    decode = flag_value(argv, "--cuda-graph-backend-decode")
    return decode not in (None, "disabled") or (decode is None and not has_flag(argv, "--disable-cuda-graph"))


DRAFT_EXTEND_GRAPH_OFF = "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"


def check_cuda_graph(argv: list[str], cfg: EssConfig, environ) -> None:
    """--ess-cuda-graph with decode graphs on: refuse what a replayed graph cannot hold - options whose
    per-step state lives on the host (pools/pool_adapter._check_graph_mode checks the store again) and
    SGLang modes whose graphs ESS does not capture. MTP (EAGLE / NextN) is captured: the target's
    TARGET_VERIFY and the draft's decode steps (backends/cuda_graph.py); the draft extend is not, so unless
    the user set it, ``SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=1`` is put into `environ` (SGLang then runs that
    step eager), and a value turning it back on is refused. Two-Batch Overlap is captured, with or without MTP:
    each child's micro-batch of a decode step (store_forward._decode_graph) and of a TARGET_VERIFY step
    (store_forward._extend_graph -> cuda_graph.graph_verify). Split fetch is captured too: on the stream engine
    its exchange has a static size (prefetch/split_fetch.py, SplitFetch.size_for_store)."""
    why = []
    mtp = flag_value(argv, "--speculative-algorithm") not in (None, "", "NONE", "none")
    if mtp:
        off = environ.get(DRAFT_EXTEND_GRAPH_OFF)
        if off is None:
            environ[DRAFT_EXTEND_GRAPH_OFF] = "1"
            logger.info("--ess-cuda-graph with MTP: target verify and draft decode steps are captured; the EAGLE draft "
                        "extend runs eager (%s=1)", DRAFT_EXTEND_GRAPH_OFF)
        elif str(off).lower() not in ENV_TRUE:
            why.append(f"MTP with {DRAFT_EXTEND_GRAPH_OFF}={off}: SGLang would capture the EAGLE draft extend "
                       "(DRAFT_EXTEND_V2), which ESS does not hold; unset it or set it to 1 (that step then runs "
                       "eager)")
    if has_flag(argv, "--debug-cuda-graph"):
        why.append("--debug-cuda-graph: it needs SGLang's breakable graphs, which run attention outside the graph")
    if has_flag(argv, "--enable-torch-compile"):
        why.append("--enable-torch-compile: the compiler would trace the store's Python (not tested)")
    dsa_decode = flag_value(argv, "--dsa-decode-backend")
    if dsa_decode not in ("flashmla_kv", "flashmla_sparse"):
        why.append(f"--dsa-decode-backend {dsa_decode or '(unset: SGLang chooses)'}: only the FlashMLA decode paths "
                   "(flashmla_kv, flashmla_sparse) are captured; the Triton decode's split attention is checked eager "
                   "only")
    if cfg.prefetch_engine not in ("auto", "stream"):
        why.append(f"--ess-prefetch-engine {cfg.prefetch_engine}: a graph is ordered by the stream engine's "
                   "streams (use stream or auto)")
    if cfg.speculative_prefetch != "off":
        why.append("--ess-speculative-prefetch: its predictor runs on the host each step")
    if cfg.share_host_pool == "on":
        why.append("--ess-share-host-pool on: its per-forward lockstep check runs on the host")
    if cfg.trace_file:
        why.append("--ess-trace-file: it copies every plan's top-k to the host")
    if str(environ.get("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "")).lower() in ENV_TRUE:
        why.append("SGLANG_ENABLE_METADATA_GLUE_GRAPH: a glued replay skips the hook that orders ESS's eager work "
                   "before the graph")
    if why:
        raise PreflightError("--ess-cuda-graph cannot be used with " + "; ".join(why))


def sizing_json(sizing: dict) -> str:
    return json.dumps(sizing, sort_keys=True)
