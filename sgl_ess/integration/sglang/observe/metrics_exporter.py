"""Prometheus exporter of the metrics declared in ``sgl_ess.obs.metrics`` (scheduler process).

SGLang's ``--enable-metrics`` sets PROMETHEUS_MULTIPROC_DIR before it spawns the schedulers and
serves ``/metrics`` with a MultiProcessCollector, so metrics created here appear on the same
endpoint as ``sglang:*``. A daemon thread samples the store adapter's ``usage()`` and the
scheduler's pool and queue once a second (idle included, so gauges fall back to zero when
requests finish); cumulative store counters become Prometheus counters by their increase.
Missing ``usage()`` keys (e.g. ``prefetch`` before the store reports it) are skipped.
"""

from __future__ import annotations

import logging
import threading

from sgl_ess.obs.metrics import BY_NAME

from ..pools import lifecycle
from . import scheduler_state

logger = logging.getLogger("sgl_ess.metrics")
INTERVAL_S = 1.0
RANK_LABELS = ("rank", "dp_rank", "tp_rank", "pp_rank", "node_rank")   # every sgless_* series carries them
_started = False


class _Exporter:
    def __init__(self, rank_labels: dict[str, str], link_bytes_per_s: float):
        """`rank_labels`: rank (the TP rank, as before), dp_rank, tp_rank, pp_rank, node_rank."""
        from prometheus_client import Counter, Gauge

        self.rank_labels = dict(rank_labels)
        self.metrics = {}
        for spec in BY_NAME.values():
            labels = tuple(RANK_LABELS) + spec.labels
            if spec.kind == "counter":
                self.metrics[spec.name] = Counter(spec.name[: -len("_total")], spec.help, labels)
            else:
                self.metrics[spec.name] = Gauge(spec.name, spec.help, labels, multiprocess_mode="mostrecent")
        self.last: dict[tuple, float] = {}
        self.set("sgless_transfer_link_bytes_per_second", link_bytes_per_s)

    def set(self, name: str, value, **labels) -> None:
        if value is None:
            return
        self.metrics[name].labels(**self.rank_labels, **labels).set(float(value))

    def total(self, name: str, value, **labels) -> None:
        """Counter from a cumulative value: add the increase since the last sample."""
        if value is None:
            return
        key = (name, tuple(sorted(labels.items())))
        delta = float(value) - self.last.get(key, 0.0)
        self.last[key] = float(value)
        if delta > 0:
            self.metrics[name].labels(**self.rank_labels, **labels).inc(delta)
        elif delta < 0:                      # the source restarted (worker restart): count from there
            self.metrics[name].labels(**self.rank_labels, **labels).inc(float(value))

    def sample(self, sched) -> None:
        adapter = lifecycle.active_store()
        from . import slo_hooks

        slo = slo_hooks.state()
        if slo is not None:
            self.set("sgless_slo_tpot_target_ms", slo["target_ms"])
            self.set("sgless_slo_tpot_measured_ms", slo["measured_ms"])
            self.set("sgless_slo_batch_cap", slo["cap"])
            self.total("sgless_slo_cap_changes_total", slo["changes"])
        q = scheduler_state.queue_state(sched)
        self.set("sgless_queue_requests", q["waiting_requests"])
        self.set("sgless_queue_oldest_wait_seconds", q["oldest_wait_s"])
        self.set("sgless_running_requests", q["running_requests"])
        for queue, n in (q.get("pd") or {}).items():
            if queue.endswith("_requests"):
                self.set("sgless_pd_queue_requests", n, queue=queue[: -len("_requests")])
        self.set("sgless_enabled", 1 if adapter is not None else 0)
        if adapter is None:
            return
        split = scheduler_state.pool_split(sched)
        for state in ("live", "cached", "free"):
            self.set("sgless_host_pool_tokens", split["tokens_" + state], state=state)
        u = adapter.usage()
        self.set("sgless_host_pool_capacity_tokens", split["tokens_capacity"])
        self.set("sgless_host_pool_bytes", u.get("host_bytes"))
        self.set("sgless_hot_slots_used", u.get("hot_slots_used"))
        self.set("sgless_hot_slots_capacity", u.get("hot_slots_capacity"))
        self.set("sgless_hot_requests_open", u.get("hot_requests_open"))
        self.set("sgless_device_hot_buffer_bytes", u.get("device_bytes"))
        self.set("sgless_hit_ratio", u.get("hit_rate"))
        self._counters(u.get("counters") or {}, u)
        if q.get("pd"):
            for key in ("pd_warm_starts", "pd_warm_rejected", "pd_warm_sent"):
                self.total(f"sgless_{key}_total", u.get(key))
            self.total("sgless_pd_cold_starts_total", u.get("cold_starts"))
        self._prefetch(u.get("prefetch") or {})

    def _counters(self, c: dict, u: dict) -> None:
        """Store counters from usage(): per-layer hits/misses and bytes each way (top-level keys of
        the adapter's usage(); an older adapter nests them under "counters")."""
        hits = u.get("hits_per_layer", c.get("layer_hits")) or []
        misses = u.get("misses_per_layer", c.get("layer_misses")) or []
        for layer, (h, m) in enumerate(zip(hits, misses)):
            self.total("sgless_hot_hits_total", h, layer=str(layer))
            self.total("sgless_hot_misses_total", m, layer=str(layer))
        for direction in ("h2d", "d2h"):
            rows = u.get("rows_" + direction)
            if rows is None and c.get("rows_" + direction) is not None:
                rows = sum(c["rows_" + direction])
            self.total("sgless_rows_moved_total", rows, direction=direction)
            self.total("sgless_bytes_moved_total", u.get("bytes_" + direction, c.get("bytes_" + direction)),
                       direction=direction)
        warm = u.get("warmup_rows")
        if warm is None and c.get("warmup_rows") is not None:
            warm = sum(c["warmup_rows"])
        self.total("sgless_warmup_rows_total", warm)

    def _prefetch(self, p: dict) -> None:
        for tier, d in (p.get("tiers") or {}).items():
            if not isinstance(d, dict):
                continue
            self.total("sgless_prefetch_plans_total", d.get("plans"), tier=tier)
            self.total("sgless_prefetch_rows_total", d.get("rows"), tier=tier)
            self.total("sgless_prefetch_busy_seconds_total", d.get("busy_s"), tier=tier)
            self.total("sgless_prefetch_dropped_total", d.get("dropped"), tier=tier)
        self.total("sgless_prefetch_worker_restarts_total", p.get("worker_restarts", p.get("restarts")))
        spec = p.get("speculative") if isinstance(p.get("speculative"), dict) else {}
        self.set("sgless_prefetch_speculative_precision", p.get("speculative_precision", spec.get("precision")))


def start(sched, ops) -> None:
    """Start the sampling thread once per scheduler process."""
    global _started
    if _started:
        return
    _started = True
    try:
        ident = scheduler_state.rank_identity()
        rank_labels = {k: str(ident.get(k, 0)) for k in RANK_LABELS if k != "rank"}
        rank_labels["rank"] = rank = rank_labels["tp_rank"]
        exporter = _Exporter(rank_labels, ops.metrics_link_gb_per_s * 1e9)
    except ImportError as e:
        logger.error("ESS metrics off: %s (pip install prometheus_client)", e)
        return

    def run():
        failures = 0
        while True:
            try:
                exporter.sample(sched)
                failures = 0
            except Exception:  # noqa: BLE001 - metrics must never take the scheduler down
                failures += 1
                if failures in (1, 100):
                    logger.exception("ESS metrics sample failed (%d in a row)", failures)
            threading.Event().wait(INTERVAL_S)

    threading.Thread(target=run, name="sgl-ess-metrics", daemon=True).start()
    logger.info("ESS metrics: %d sgless_* metrics exported on /metrics (rank %s)", len(BY_NAME), rank)
