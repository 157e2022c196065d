"""How many hot-buffer slots each request gets per layer on a serving node: one rule, used by the
launcher's preflight (sgl_ess/serving/preflight.py, before the model loads) and by the store the
scheduler builds (integration/sglang/pools/pool_adapter.py), so the two cannot disagree. Pure Python.

  --ess-hot-slots-per-request N   N
  --ess-max-gpu-buffer-size-gb G  G bytes / (request rows x layers x row bytes), rounded down
  neither                         4 x index_topk
The result must hold one step's top-k plus the newest row (>= topk + 1); the caller says how it
fails. (The store's own ``hot_slots_for`` sizes N from a sparse-memory ratio, for benchmarks and the
simulator; serving takes one of the two flags above.)
"""

from __future__ import annotations


def hot_slots_rule(hot_slots: int, max_gpu_buffer_size_gb: float, layers: int, row_bytes: int, topk: int,
                   request_rows: int) -> tuple[int, str]:
    """(slots per request per layer, the flag that chose it, for messages)."""
    if hot_slots:
        return int(hot_slots), f"--ess-hot-slots-per-request {hot_slots}"
    if max_gpu_buffer_size_gb:
        rows = max(1, int(request_rows))
        n = int(max_gpu_buffer_size_gb * 1e9) // (layers * row_bytes * rows)
        return n, (f"--ess-max-gpu-buffer-size-gb {max_gpu_buffer_size_gb:g} / ({rows} request rows x "
                   f"{layers} layers x {row_bytes} B)")
    return 4 * int(topk or 0), "4 x index_topk"
