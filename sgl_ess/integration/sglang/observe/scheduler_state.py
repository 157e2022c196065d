"""Read-only views of one scheduler's state for /ess/status, /health and metrics (scheduler process).

Token pool split (with ESS on the pool IS the host pool):
  live    rows held by running or queued-with-memory requests (radix nodes locked by a request)
  cached  rows kept only by the prefix (radix) cache: evictable at any time, not a leak
  free    rows the allocator can hand out now
A leak is live > 0 with no request in the server; cache is cached > 0, and it shrinks on demand.

Called from the scheduler's own thread (internal state) and from the metrics thread: reads only
(ints and list lengths), no locks taken on SGLang's side.
"""

from __future__ import annotations

import time


def pool_split(scheduler) -> dict:
    alloc = scheduler.token_to_kv_pool_allocator
    capacity = int(alloc.size)
    free = int(alloc.available_size())
    tree = getattr(scheduler, "tree_cache", None)
    try:
        cached = int(tree.evictable_size()) if tree is not None else 0
    except Exception:  # noqa: BLE001 - a cache without eviction accounting (disabled radix)
        cached = 0
    live = max(0, capacity - free - cached)
    return {"tokens_capacity": capacity, "tokens_live": live, "tokens_cached": cached, "tokens_free": free}


def queue_state(scheduler) -> dict:
    waiting = list(getattr(scheduler, "waiting_queue", []) or [])
    now = time.perf_counter()
    entries = [getattr(getattr(r, "time_stats", None), "wait_queue_entry_time", 0.0) for r in waiting]
    entries = [t for t in entries if t]
    running = getattr(scheduler, "running_batch", None)
    n_running = len(getattr(running, "reqs", []) or []) if running is not None else 0
    out = {"waiting_requests": len(waiting), "oldest_wait_s": round(now - min(entries), 3) if entries else 0.0,
           "running_requests": n_running}
    pd = pd_queues(scheduler)
    if pd:
        out["pd"] = pd
    return out


def _qlen(obj, attr: str = "queue") -> int:
    q = getattr(obj, attr, None) if obj is not None else None
    return len(q) if q is not None else 0


def pd_queues(scheduler) -> dict:
    """SGLang's disaggregation queues, by role ({} on a colocated server): a decode node's
    pre-allocation queue (bootstrapped, waiting for memory), transfer queue (KV in flight) and retracted
    requests; a prefill node's bootstrap queue (waiting for the decode) and in-flight sends."""
    mode = str(getattr(getattr(scheduler, "disaggregation_mode", None), "value", "null") or "null")
    if mode == "decode":
        pre = getattr(scheduler, "disagg_decode_prealloc_queue", None)
        return {"role": "decode", "prealloc_requests": _qlen(pre), "retracted_requests": _qlen(pre, "retracted_queue"),
                "transfer_requests": _qlen(getattr(scheduler, "disagg_decode_transfer_queue", None))}
    if mode == "prefill":
        inflight = getattr(scheduler, "disagg_prefill_inflight_queue", None)
        return {"role": "prefill", "bootstrap_requests": _qlen(getattr(scheduler, "disagg_prefill_bootstrap_queue", None)),
                "inflight_requests": len(inflight) if inflight is not None else 0}
    return {}


def ops_state(scheduler) -> dict:
    """The ``ess_ops`` entry of the internal state: pool split and queue (ESS on or off)."""
    from ..pools import lifecycle

    if scheduler is None:
        return {}
    split = pool_split(scheduler)
    store = lifecycle.active_store()
    # SGLang's token pool split stands for the host store's rows where those rows are tokens (DSA); a store
    # of another unit (DeepSeek-V4: one row per C4 entry) reports its own host_tokens_*, the split stays kv_pool_*
    tokens = store is not None and getattr(store, "host_row_unit", "token") == "token"
    prefix = "host_" if tokens else "kv_pool_"
    out = {prefix + k: v for k, v in split.items()}
    out["queue"] = queue_state(scheduler)
    return out


def merged(state: dict) -> dict:
    """One scheduler's view for /ess/status and /health: the store's ``ess`` usage + ``ess_ops``."""
    out = dict(state.get("ess") or {"enabled": False})
    out.setdefault("enabled", "host_tokens_capacity" in out)
    out.update(state.get("ess_ops") or {})
    if out.get("host_bytes"):
        out["memory_pool_size_gb_effective"] = out["host_bytes"] / 1e9
    return out


def rank_identity() -> dict:
    """Where this scheduler process sits: SGLang's parallel ranks and the node (``--node-rank``)."""
    import os

    from sglang.srt.runtime_context import get_parallel, get_server_args

    par = get_parallel()
    out = {"pid": os.getpid()}
    for name in ("tp_rank", "attn_tp_rank", "attn_dp_rank", "pp_rank", "moe_ep_rank"):
        try:
            out[name] = int(getattr(par, name))
        except Exception:  # noqa: BLE001 - a width this layout does not define
            pass
    out["dp_rank"] = out.get("attn_dp_rank", 0)
    out["node_rank"] = int(getattr(get_server_args(), "node_rank", 0) or 0)
    return out


def gather_ranks(summary: dict) -> list[dict] | None:
    """Every attention-TP rank's `summary`, gathered on all of them (one collective over the group's
    gloo group: every rank runs the internal-state handler, SGLang broadcasts control requests to
    all). None with one rank per attention group."""
    from sglang.srt.distributed.parallel_state import get_attn_tp_group

    group = get_attn_tp_group()
    if group.world_size <= 1:
        return None
    return group.all_gather_object(summary)
