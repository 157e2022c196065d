"""What ``python -m sgl_ess.launch_server`` adds to the user's SGLang flags, and how the token
pool is sized. Everything here runs before SGLang is imported and before the model loads.

Pool sizing, honestly (with ESS on, SGLang's token pool IS the host latent pool):
  * ``--ess-memory-pool-size-gb G`` (flag or YAML) alone -> ``--max-total-tokens`` for G GB;
  * ``--max-total-tokens N`` alone -> N tokens;
  * both -> refused unless they give the same tokens (one of them would otherwise be ignored);
  * neither -> the launcher default (65536 tokens with ESS on, 16384 off); on a GPU machine with
    ESS on, the host memory available minus a safety margin (sgl_ess/serving/host_memory.py).
With ESS on, the host pool's bytes are checked against available host memory before anything loads.
With ESS off a host-pool budget has no meaning: it is reported and warned about, not applied.
With ``--ess-lock-host-memory`` the bytes each process will mlock (host pool, and on CPU the slot
space) are checked against RLIMIT_MEMLOCK (sgl_ess.serving.preflight.check_memlock).
The result is exported as ``SGLESS_POOL_SIZING`` and shown by /ess/status next to the bytes
each scheduler really allocated.
"""

from __future__ import annotations

import json
import logging
import os

from sgl_ess.config import EssConfig
from sgl_ess.core.parallel_layout import ParallelLayout, host_pool_bytes, shares_host_pool
from sgl_ess.models import TINY_DSV32_DIR
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import (DSA_PAGE_SIZE, PreflightError, check_hot_slots, check_memlock, locked_bytes,
                                       model_geometry, resolve_pool_tokens, slot_space_bytes)

logger = logging.getLogger("sgl_ess")

DEFAULT_PORT = 30000
DEFAULT_MAX_RUNNING_REQUESTS = 64
DEFAULT_HOST_TOKENS = 65536          # ESS on: host pool tokens when nothing sizes it
DEFAULT_DEVICE_TOKENS = 16384        # ESS off: device pool tokens when nothing sizes it
EMBEDDED_MODEL_NAME = "tiny_dsv32"


def has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def int_flag(argv: list[str], flag: str) -> int | None:
    v = flag_value(argv, flag)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise PreflightError(f"{flag}: got {v!r}; expected an integer")


def fill_defaults(argv: list[str], cfg: EssConfig, has_cuda: bool) -> tuple[list[str], dict]:
    """(argv for SGLang with the launcher's defaults, pool sizing). Raises PreflightError."""
    out = list(argv)
    eng = cfg.engine
    if not has_flag(out, "--model-path") and not has_flag(out, "--model"):
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
    geo = model_geometry(flag_value(out, "--model-path") or flag_value(out, "--model") or "")
    if geo is not None and flag_value(out, "--kv-cache-dtype") == "fp8_e4m3":
        geo = fp8_geometry(geo, flag_value(out, "--model-path") or flag_value(out, "--model") or "")
    pool_gb = cfg.memory_pool_size_gb
    if has_cuda and cfg.enabled and not pool_gb and not has_flag(out, "--max-total-tokens"):
        usable = host_memory.usable_bytes(host_memory.meminfo())
        if usable:
            pool_gb = usable / 1e9
            logger.info("ESS host pool: %.1f GB by default (available host memory minus the safety margin; "
                        "set --ess-memory-pool-size-gb to choose)", pool_gb)
    page = int_flag(out, "--page-size") or DSA_PAGE_SIZE
    given = int_flag(out, "--max-total-tokens")
    default = DEFAULT_HOST_TOKENS if cfg.enabled else DEFAULT_DEVICE_TOKENS
    tokens, source = resolve_pool_tokens(cfg.enabled, pool_gb, given, geo, page, default)
    if given is None:
        out += ["--max-total-tokens", str(tokens)]
    if not cfg.enabled and cfg.memory_pool_size_gb:
        logger.warning("memory_pool_size_gb=%g is NOT applied: ESS is off, so there is no host pool; the device "
                       "pool has %d tokens (%s)", cfg.memory_pool_size_gb, tokens, source)
    sizing = {"tokens": tokens, "source": source, "ess_enabled": cfg.enabled, "page_size": page,
              "memory_pool_size_gb_requested": cfg.memory_pool_size_gb or None}
    if cfg.enabled and geo is not None:
        sizing["host_bytes_expected"] = host_pool_bytes(tokens, page, geo.layers, geo.latent_row_bytes)
        lay = parallel_layout(out)
        pools = pools_per_node(lay, has_cuda, cfg.share_host_pool)
        sizing.update(pools_per_node=pools, ranks_per_node=lay["ranks_per_node"],
                      host_bytes_per_node=pools * sizing["host_bytes_expected"])
        if pools > 1 or lay["ranks_per_node"] > 1:
            logger.info("ESS host pools on this node: %d pool(s) of %.3f GB = %.3f GB for %d rank(s) (%s)", pools,
                        sizing["host_bytes_expected"] / 1e9, sizing["host_bytes_per_node"] / 1e9,
                        lay["ranks_per_node"], "one per attention-TP group on this node, shared by its ranks"
                        if not has_cuda else "one per rank on CUDA")
        host_memory.check_host_pool(sizing["host_bytes_per_node"],
                                    source if pools == 1 else f"{source}, x {pools} pools on this node")
        running = int_flag(out, "--max-running-requests")
        sizing["hot_slots_per_request"] = check_hot_slots(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb,
                                                          geo, running)
    if cfg.lock_host_memory:
        check_lock(cfg, geo, sizing, running=int_flag(out, "--max-running-requests"), has_cuda=has_cuda)
    return out, sizing


def check_lock(cfg: EssConfig, geo, sizing: dict, running: int, has_cuda: bool) -> None:
    """--ess-lock-host-memory: refuse it with ESS off (there is no ESS host memory to lock), and refuse
    bytes above RLIMIT_MEMLOCK. Without a local config.json the bytes are unknown here; the mlock
    itself then fails with the same fix when the store is built."""
    if not cfg.enabled:
        raise PreflightError("--ess-lock-host-memory needs ESS on: with --ess-enabled false the latent cache is "
                             "SGLang's own pool, which sgl-ess does not allocate; drop one of the two flags")
    if geo is None:
        logger.info("--ess-lock-host-memory: no local config.json, so the bytes to lock are checked when the "
                    "store is built, not before the model loads")
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


_ALIASES = {"tp": ("--tp", "--tp-size", "--tensor-parallel-size"), "dp": ("--dp", "--dp-size", "--data-parallel-size"),
            "pp": ("--pp", "--pp-size", "--pipeline-parallel-size"), "nnodes": ("--nnodes",)}


def parallel_layout(argv: list[str]) -> dict:
    """tp, dp, pp, nnodes, dp_attention and ranks_per_node from SGLang's flags (any alias);
    ``--attn-dp-size N`` counts as ``--dp N --enable-dp-attention`` (SGLang 0.5.23's newer spelling)."""
    vals = {}
    for key, flags in _ALIASES.items():
        given = [int_flag(argv, f) for f in flags]
        vals[key] = next((v for v in given if v is not None), 1)
    lay, _ = ParallelLayout.from_sglang(**vals, dp_attention=has_flag(argv, "--enable-dp-attention"),
                                        attn_dp_size=next((v for v in (int_flag(argv, f) for f in (
                                            "--attn-dp-size", "--attention-data-parallel-size")) if v is not None), 1))
    return {"tp": lay.tp, "dp": lay.dp, "pp": lay.pp, "nnodes": lay.nnodes, "dp_attention": lay.dp_attention,
            "ranks_per_node": lay.ranks_per_node}


def pools_per_node(lay: dict, has_cuda: bool, share_mode: str = "auto") -> int:
    """ESS host pools one node allocates: one per attention-TP group on the node when its ranks share it
    (shared_host_pool.py; --ess-share-host-pool: by default on CPU, on CUDA only with `on`), else one per
    rank. The rule itself is sgl_ess.core.parallel_layout, which the capacity planner (sgl_ess.sim plan)
    uses too."""
    return _layout(lay).pools_per_node(shared=shares_host_pool(share_mode, has_cuda))


def _layout(lay: dict) -> ParallelLayout:
    return ParallelLayout(tp=lay["tp"], dp=lay["dp"], pp=lay["pp"], nnodes=lay["nnodes"],
                          dp_attention=lay["dp_attention"])


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


def check_cuda_graph(argv: list[str], cfg: EssConfig, environ) -> None:
    """--ess-cuda-graph with decode graphs on: refuse what a replayed graph cannot hold - options whose
    per-step state lives on the host (pools/pool_adapter._check_graph_mode checks the store again) and
    SGLang modes whose graphs ESS does not capture."""
    why = []
    if flag_value(argv, "--speculative-algorithm") not in (None, "", "NONE", "none"):
        why.append("MTP (--speculative-algorithm): the draft and verify steps are not captured with ESS")
    if has_flag(argv, "--enable-two-batch-overlap"):
        why.append("--enable-two-batch-overlap: TBO children are not captured with ESS")
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
    if cfg.tp_split_fetch:
        why.append("--ess-tp-split-fetch: its exchange is planned on the host each step")
    if cfg.trace_file:
        why.append("--ess-trace-file: it copies every plan's top-k to the host")
    if str(environ.get("SGLANG_ENABLE_METADATA_GLUE_GRAPH", "")).lower() in ENV_TRUE:
        why.append("SGLANG_ENABLE_METADATA_GLUE_GRAPH: a glued replay skips the hook that orders ESS's eager work "
                   "before the graph")
    if why:
        raise PreflightError("--ess-cuda-graph cannot be used with " + "; ".join(why))


def fp8_geometry(geo, model_path: str):
    """The model geometry with FlashMLA's FP8 row: kv_lora_rank fp8 + 4 B per 128 + rope bf16."""
    import dataclasses

    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            c = json.load(fh)
        r, p = int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
    except (OSError, KeyError, ValueError):
        return geo
    return dataclasses.replace(geo, latent_row_bytes=r + 4 * (r // 128) + 2 * p)


def sizing_json(sizing: dict) -> str:
    return json.dumps(sizing, sort_keys=True)
