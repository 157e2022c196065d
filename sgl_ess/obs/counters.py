"""StoreCounters: hits, misses and rows/bytes moved, per layer and per request.

Memory: int64 tensors on the store's device, updated with tensor ops in the hot path (no host
sync); read back only by `snapshot()` (metrics, tests, benchmarks).

| counter            | shape  | answers                                               |
| ------------------ | ------ | ----------------------------------------------------- |
| hits / misses      | [L, R] | per (layer, request index) since the request opened      |
| layer_hits/misses  | [L]    | per layer since start (survives requests)              |
| rows_h2d / d2h     | [L]    | rows fetched host->device (misses + warmup) / written |
| warmup_rows        | [L]    | rows fetched by LRU warmup                             |
| refetch_rows       | [L]    | staged rows re-fetched inline (stale ring tag)         |
Bytes are rows x row_bytes.
"""
from __future__ import annotations

import torch


class StoreCounters:
    def __init__(self, num_layers: int, max_requests: int, row_bytes: int, device: torch.device):
        z = lambda *s: torch.zeros(s, dtype=torch.int64, device=device)  # noqa: E731
        self.row_bytes = row_bytes
        self.hits, self.misses = z(num_layers, max_requests), z(num_layers, max_requests)
        # [L, 3]: a layer's hits, misses and rows fetched side by side, so a fused kernel updates
        # them through one pointer (sgl_ess/kernels/plan_epilogue_triton.py); the names are views
        self.step_counts = z(num_layers, 3)
        self.layer_hits, self.layer_misses = self.step_counts[:, 0], self.step_counts[:, 1]
        self.rows_h2d = self.step_counts[:, 2]
        self.rows_d2h, self.warmup_rows = z(num_layers), z(num_layers)
        self.refetch_rows = z(num_layers)

    def reset_request(self, req: int) -> None:
        self.hits[:, req] = 0
        self.misses[:, req] = 0

    def add_step(self, layer: int, reqs: torch.Tensor, hit: torch.Tensor, miss: torch.Tensor) -> None:
        h = hit.sum(dim=1)
        m = miss.sum(dim=1)
        reqs = reqs.clamp(min=0)          # a padded batch row (-1) has neither: it adds 0 to row 0
        self.hits[layer].index_add_(0, reqs, h)
        self.misses[layer].index_add_(0, reqs, m)
        self.layer_hits[layer] += h.sum()
        self.layer_misses[layer] += m.sum()
        self.rows_h2d[layer] += m.sum()

    def add_warmup(self, layer: int, n_rows: int) -> None:
        self.warmup_rows[layer] += n_rows
        self.rows_h2d[layer] += n_rows

    def add_refetch(self, layer: int, n_rows: int) -> None:
        self.refetch_rows[layer] += n_rows
        self.rows_h2d[layer] += n_rows

    def add_d2h(self, layer: int, n_rows: int) -> None:
        self.rows_d2h[layer] += n_rows

    def add_d2h_every_layer(self, n_rows: int) -> None:
        """Each layer wrote `n_rows` (a decode graph's replay): one tensor op for all layers."""
        self.rows_d2h += n_rows

    def request(self, req: int) -> dict:
        return {"hits": self.hits[:, req].tolist(), "misses": self.misses[:, req].tolist()}

    def snapshot(self) -> dict:
        hits, misses = self.layer_hits.tolist(), self.layer_misses.tolist()
        total = sum(hits) + sum(misses)
        return {
            "layer_hits": hits,
            "layer_misses": misses,
            "hit_rate": (sum(hits) / total) if total else None,
            "rows_h2d": self.rows_h2d.tolist(),
            "rows_d2h": self.rows_d2h.tolist(),
            "warmup_rows": self.warmup_rows.tolist(),
            "refetch_rows": self.refetch_rows.tolist(),
            "bytes_h2d": int(self.rows_h2d.sum()) * self.row_bytes,
            "bytes_d2h": int(self.rows_d2h.sum()) * self.row_bytes,
        }
