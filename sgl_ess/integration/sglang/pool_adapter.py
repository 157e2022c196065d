"""Adapter between SGLang's pools/requests and ``sgl_ess.store.LatentStore``.

Memory ownership (ESS on):
  * The store's host pool (``LatentStore.host.rows`` uint8 ``[L, T, B]``) IS SGLang's latent
    pool: each ``DSATokenToKVPool.kv_buffer[layer]`` is replaced by a bf16 view of the host
    rows, so SGLang's token allocator hands out host locations, ``req_to_token`` is the
    token -> host-location map, and SGLang's radix cache shares host rows between requests
    unchanged. T = SGLang pool size + one page (its padded slots).
  * The hot buffers (``LatentStore.hot``, R x N slots per layer) are the only latent memory
    on the device; R = SGLang's request rows (``req_pool_idx``, row 0 is SGLang's padding).
  * SGLang's index-key pool (lightning-indexer keys for every token) stays on the device.

Lifecycle: ``after_extend`` opens and warms a request's hot buffer (last prefill chunk wins),
``resolve`` runs every decode step and layer, ``close`` runs when SGLang frees the request
row (finish, abort, retract), ``clear_locs`` when SGLang frees token pages (rows hold user data).
"""

from __future__ import annotations

import logging
import threading

import torch

from sgl_ess.config import EssConfig

logger = logging.getLogger(__name__)


def derive_hot_slots(cfg: EssConfig, topk: int, layers: int, row_bytes: int, max_requests: int) -> int:
    """Hot slots per request per layer from the ESS config; >= topk + 1."""
    if cfg.hot_slots_per_request:
        n = cfg.hot_slots_per_request
        source = "ess_config.hot_slots_per_request"
    elif cfg.max_gpu_buffer_size_gb:
        n = int(cfg.max_gpu_buffer_size_gb * 1e9) // (layers * row_bytes * max_requests)
        source = "ess_config.max_gpu_buffer_size_gb"
    else:
        return 4 * topk
    if n < topk + 1:
        raise ValueError(
            f"{source} gives {n} hot slots per request per layer; the model's index_topk={topk} needs "
            f">= {topk + 1} (top-k plus the newest token). Raise {source} or lower --max-running-requests")
    return n


class EssLatentStore:
    """One per model runner (scheduler process). Thread-safe for the calls SGLang makes."""

    def __init__(self, model_runner, cfg: EssConfig):
        from sgl_ess.store import LatentStore, StoreConfig

        pool = model_runner.token_to_kv_pool
        mc = model_runner.model_config
        self.kv_dim = mc.kv_lora_rank + mc.qk_rope_head_dim
        self.dtype = pool.store_dtype
        if self.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"ESS on needs a 16/32-bit latent cache on this path; got {self.dtype}. "
                             "Pass --kv-cache-dtype bfloat16")
        self.row_bytes = self.kv_dim * self.dtype.itemsize
        self.layers = pool.layer_num
        self.topk = mc.hf_config.index_topk
        req_to_token = model_runner.req_to_token_pool.req_to_token
        max_requests = req_to_token.shape[0]
        hot = derive_hot_slots(cfg, self.topk, self.layers, self.row_bytes, max_requests)
        self.store_cfg = StoreConfig(
            num_layers=self.layers, row_bytes=self.row_bytes,
            host_capacity_tokens=pool.kv_buffer[0].shape[0], hot_slots_per_request=hot,
            max_requests=max_requests, topk=self.topk, max_context_tokens=req_to_token.shape[1],
            device=str(model_runner.device), warmup_window=cfg.warmup_queries)
        self.store = LatentStore(self.store_cfg)
        self.allocator = None
        self._lock = threading.Lock()
        self._alias_pool_to_host(pool)
        logger.info("ESS store: %d layers x %d host rows x %d B (host %.1f MB), hot %d slots/request x %d rows "
                    "(device %.2f MB)", self.layers, self.store_cfg.host_capacity_tokens, self.row_bytes,
                    self.store_cfg.host_bytes / 1e6, hot, max_requests, self.store_cfg.device_bytes / 1e6)

    def _alias_pool_to_host(self, pool) -> None:
        if pool.device != "cpu" and str(pool.device) != "cpu":
            raise NotImplementedError(
                f"ESS on with the latent pool on {pool.device}: the CUDA host-pool path is not built yet. "
                "Run with --ess-enabled false on GPUs for now")
        views = []
        for layer in range(self.layers):
            host = self.store.host.rows[layer]
            views.append(host.view(self.dtype).view(host.shape[0], 1, self.kv_dim))
        old = pool.kv_buffer
        pool.kv_buffer = views
        if hasattr(pool, "data_ptrs"):
            pool.data_ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.uint64, device=pool.device)
        del old

    # --- per forward ------------------------------------------------------------------
    def after_extend(self, layer: int, rows: list[int], seq_lens: list[int], n_q: list[int],
                     topk: torch.Tensor, req_to_token: torch.Tensor) -> None:
        """Prefill chunk done for `layer`: (re)open hot buffers and warm them from the last W queries."""
        w = max(1, self.store_cfg.warmup_window)
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
            self.store.warmup(layer, r, s, ids, req_to_token)

    def resolve(self, layer: int, rows: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                req_to_token: torch.Tensor) -> torch.Tensor:
        with self._lock:
            return self.store.resolve(layer, rows, seq_lens, topk, req_to_token, validate=layer == 0)

    def admit(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, latent: torch.Tensor) -> None:
        """The decode step's newest latent rows ([b, kv_dim] in the cache dtype, as SGLang just
        wrote them to the host pool) go straight into hot slots: no fetch-back as a miss."""
        data = latent.contiguous().view(torch.uint8).reshape(latent.shape[0], self.row_bytes)
        with self._lock:  # the batch is checked once per step (layer 0), not on every layer
            self.store.admit(layer, rows, positions, data, validate=layer == 0)

    def hot_rows(self, layer: int) -> torch.Tensor:
        """[R*N, kv_dim] view of this layer's hot slots, in the cache dtype."""
        return self.store.layer_rows(layer).view(self.dtype).view(-1, self.kv_dim)

    # --- lifecycle --------------------------------------------------------------------
    def close_rows(self, rows: list[int]) -> None:
        with self._lock:
            for r in rows:
                if 0 <= r < self.store_cfg.max_requests:
                    self.store.close(r)

    def clear_locs(self, locs: torch.Tensor) -> None:
        with self._lock:
            self.store.clear_host(locs.reshape(-1).long())

    def usage(self) -> dict:
        # SGLang's allocator hands out the host locations: its used size is the host usage.
        used = None if self.allocator is None else int(self.allocator.size - self.allocator.available_size())
        u = dict(self.store.usage(host_tokens_used=used))
        snap = self.store.counters.snapshot()
        u.update(hit_rate=snap["hit_rate"], rows_h2d=sum(snap["rows_h2d"]), warmup_rows=sum(snap["warmup_rows"]),
                 hot_slots_per_request=self.store_cfg.hot_slots_per_request)
        return u
