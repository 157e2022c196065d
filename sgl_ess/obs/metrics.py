"""Every Prometheus metric sgl-ess exports, in one table, with the question each answers.

Exported through SGLang's own ``--enable-metrics`` (the same ``/metrics`` endpoint as
``sglang:*``): each scheduler process updates them once a second from the ESS store adapter's
``usage()`` dict (integration/sglang/observe/metrics_exporter.py); prometheus_client's multiprocess
mode merges the processes. Labels on every metric: ``rank`` (the scheduler's TP rank), ``dp_rank``,
``tp_rank``, ``pp_rank``, ``node_rank``; plus the listed ones.
Counters follow Prometheus naming (``_total``); rates and ratios are for PromQL (see
launch/monitoring/ess_alerts.yml and ess_dashboard.json, whose queries tests check against
this table).

| metric                                   | type    | labels    | answers                                                         |
| ---------------------------------------- | ------- | --------- | --------------------------------------------------------------- |
| sgless_enabled                           | gauge   |           | is ESS on in this scheduler?                                    |
| sgless_host_pool_tokens                  | gauge   | state     | host rows live (running requests) / cached (evictable prefix) / free: a leak shows as live > 0 when idle |
| sgless_host_pool_capacity_tokens         | gauge   |           | how many token rows the host pool holds                         |
| sgless_host_pool_bytes                   | gauge   |           | host memory held for latent history                             |
| sgless_hot_slots_used                    | gauge   |           | device hot-buffer slots in use (all layers)                     |
| sgless_hot_slots_capacity                | gauge   |           | device hot-buffer slots in total                                |
| sgless_hot_requests_open                 | gauge   |           | requests with an open hot buffer                                |
| sgless_device_hot_buffer_bytes           | gauge   |           | device memory of the hot buffers                                |
| sgless_hit_ratio                         | gauge   |           | hot-buffer hit rate since start (alert on the rate form below)  |
| sgless_hot_hits_total                    | counter | layer     | top-k rows found in the hot buffer                              |
| sgless_hot_misses_total                  | counter | layer     | top-k rows fetched host->device (per layer: which layers miss)  |
| sgless_rows_moved_total                  | counter | direction | latent rows moved h2d (misses + warm-up) / d2h                  |
| sgless_bytes_moved_total                 | counter | direction | bytes moved each way; rate() is the transfer bandwidth          |
| sgless_warmup_rows_total                 | counter |           | rows pre-loaded by the prefill warm-up                          |
| sgless_transfer_link_bytes_per_second    | gauge   |           | configured link bandwidth (--metrics-link-gb-per-s): saturation reference |
| sgless_queue_requests                    | gauge   |           | requests waiting for admission                                  |
| sgless_queue_oldest_wait_seconds         | gauge   |           | how long the oldest waiting request has waited                  |
| sgless_running_requests                  | gauge   |           | requests in the running batch                                   |
| sgless_pd_queue_requests                 | gauge   | queue     | PD only: SGLang's disaggregation queues (decode: prealloc, transfer, retracted; prefill: bootstrap, inflight) |
| sgless_pd_warm_starts_total              | counter |           | PD decode: requests whose hot buffer was warmed from the prefill's state |
| sgless_pd_cold_starts_total              | counter |           | PD decode: requests that started cold (no state sent, or refused) |
| sgless_pd_warm_rejected_total            | counter |           | PD decode: warm states refused (layout, room or LRU mismatch: see the log) |
| sgless_pd_warm_sent_total                | counter |           | PD prefill: warm states written into SGLang's transfer          |
| sgless_prefetch_plans_total              | counter | tier      | prefetch plans submitted per tier (immediate/speculative/...)   |
| sgless_prefetch_rows_total               | counter | tier      | rows fetched per prefetch tier                                  |
| sgless_prefetch_busy_seconds_total       | counter | tier      | transfer-engine busy time per tier (rate() = utilisation)       |
| sgless_prefetch_dropped_total            | counter | tier      | plans dropped (speculative past its deadline)                   |
| sgless_prefetch_worker_restarts_total    | counter |           | prefetch worker restarts (should stay 0)                        |
| sgless_prefetch_speculative_precision    | gauge   |           | share of speculatively fetched rows that were then used         |
| sgless_slo_tpot_target_ms                | gauge   |           | the decode TPOT target (--ess-slo-tpot-ms; absent when off)     |
| sgless_slo_tpot_measured_ms              | gauge   |           | the controller's last measured step-time percentile             |
| sgless_slo_batch_cap                     | gauge   |           | running requests the SLO controller currently allows            |
| sgless_slo_cap_changes_total             | counter |           | how often the cap moved (a flapping cap shows as a high rate)   |

Prefetch metrics appear once the store reports ``usage()["prefetch"]``; SLO metrics only with a
TPOT target; missing keys are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "sgless_"


@dataclass(frozen=True)
class MetricSpec:
    name: str            # as exported (counters end in _total)
    kind: str            # "gauge" | "counter"
    labels: tuple[str, ...]
    help: str


def _table() -> tuple[MetricSpec, ...]:
    rows = []
    for line in __doc__.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith(PREFIX):
            name, kind, labels, answers = cells
            rows.append(MetricSpec(name, kind, tuple(x for x in labels.split(",") if x), answers))
    return tuple(rows)


METRICS: tuple[MetricSpec, ...] = _table()
BY_NAME = {m.name: m for m in METRICS}
NAMES = frozenset(BY_NAME)
