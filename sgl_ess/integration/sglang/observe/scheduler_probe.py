"""Runs once per scheduler process, right after the scheduler is built (HookRegistry AFTER on
``Scheduler.get_init_info``, the ready handshake): logs where every byte went, keeps a reference
to the scheduler for metrics, and starts the metrics thread when ``--enable-metrics`` is on.
"""

from __future__ import annotations

import logging

from sgl_ess.serving.memory_report import format_report
from sgl_ess.serving.ops_config import ops_from_env

from ..pools import lifecycle

logger = logging.getLogger("sgl_ess.memory")
_scheduler = None


def scheduler():
    return _scheduler


def _nbytes(tensors) -> int:
    total = 0
    for t in tensors or []:
        total += t.numel() * t.element_size() if hasattr(t, "numel") else 0
    return total


def memory_rows(sched) -> list[tuple[str, str, int, str]]:
    runner = sched.tp_worker.model_runner
    pool = runner.token_to_kv_pool
    adapter = lifecycle.active_store()
    layers = getattr(pool, "layer_num", 0)
    rows = [("device", "model weights", sum(p.numel() * p.element_size() for p in runner.model.parameters()),
             "the model's parameters")]
    index_cache = getattr(pool, "index_key_cache", None)
    idx = _nbytes(getattr(index_cache, "buffer", None))
    if adapter is not None:
        u = adapter.usage()
        host_tokens = u.get("host_tokens_capacity", 0)
        layers = int(getattr(adapter, "layers", layers))      # the store's layers (DeepSeek-V4: its C4 layers)
        unit = u.get("host_row_unit", "token")
        source = ("SGLang's token pool + 1 padding page" if unit == "token" else
                  f"one {unit} row per location; {u.get('host_tokens_capacity', '?')} capacity")
        rows.append(("host", "latent history (host pool)", int(u.get("host_bytes", 0)),
                     f"{host_tokens} {unit} rows x {layers} layers x {getattr(adapter, 'row_bytes', '?')} B ({source})"))
        store_cfg = getattr(adapter, "store_cfg", None)
        row_bytes = int(getattr(adapter, "row_bytes", 0) or 0)
        device = int(u.get("device_bytes", 0))
        hot = int(u.get("hot_slots_capacity", 0)) * row_bytes if row_bytes else device
        rows.append(("device", "hot buffers", hot,
                     f"{u.get('hot_slots_per_request', '?')} slots/request/layer x "
                     f"{getattr(store_cfg, 'max_requests', '?')} request rows x {layers} layers x {row_bytes} B"))
        if device > hot:
            rows.append(("device", "staging", device - hot, "prefetch staging rings (store device bytes - hot buffers)"))
    else:
        rows.append(("device", "latent pool (ESS off)", _nbytes(getattr(pool, "kv_buffer", None)),
                     f"{sched.max_total_num_tokens} tokens x {layers} layers"))
    rows.append(("device", "index keys (every token)", idx, "SGLang's DSA index-key pool"))
    rows.append(("device", "req_to_token map", _nbytes([runner.req_to_token_pool.req_to_token]),
                 "request rows x max context"))
    return rows


def _after_get_init_info(result, sched, *args, **kwargs):
    global _scheduler
    _scheduler = sched
    try:
        rows = memory_rows(sched)
        logger.info("%s", format_report(rows))
        if isinstance(result, dict):
            result["ess_memory"] = [{"where": w, "what": x, "bytes": b, "how": h} for w, x, b, h in rows]
    except Exception:  # noqa: BLE001 - a report must never stop the server from starting
        logger.exception("memory report")
    ops = ops_from_env()
    if ops.enable_metrics:
        from . import metrics_exporter

        metrics_exporter.start(sched, ops)
    return result
