"""LatentStore: the engine-facing ESS store (host pool + hot buffers + resolver + FlashTrans).

Memory ownership: the host pool (`self.host`) and the hot buffers (`self.hot`) are allocated
once here and live as long as this object. Hot-buffer rows are keyed by a request *row*
r in [0, max_requests) (an engine's request-pool index); token -> host-location maps
(`req_to_host int64 [max_requests, max_context]`) belong to the caller (SGLang's req_to_token,
or `sgl_ess.store.requests.RequestTable`), so a radix cache can share host rows between
requests.

Per decode step and layer the engine calls, in order:
  write_host(layer, locs, rows)          the step's new latent rows -> host (and `append` puts
                                         them in the hot buffer too)
  resolve(layer, rows, seq_lens, topk, req_to_host) -> slot table for attention
"""
from __future__ import annotations

import torch

from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.obs.counters import StoreCounters
from sgl_ess.store.config import StoreConfig
from sgl_ess.store.host_pool import HostLatentPool
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from sgl_ess.store.validate import check_rows, check_topk


class LatentStore:
    def __init__(self, cfg: StoreConfig, transfer_backend: str = "auto"):
        self.cfg = cfg
        dev = torch.device(cfg.device)
        pin = cfg.pin_host if cfg.pin_host is not None else dev.type == "cuda"
        self.device = dev
        self.host = HostLatentPool(cfg.num_layers, cfg.host_capacity_tokens, cfg.row_bytes, pin=pin)
        self.hot = DeviceHotBuffer(cfg.num_layers, cfg.max_requests, cfg.hot_slots_per_request,
                                   cfg.row_bytes, dev)
        self.counters = StoreCounters(cfg.num_layers, cfg.max_requests, cfg.row_bytes, dev)
        self.transfer_backend = transfer_backend

    # --- request lifetime ---------------------------------------------------------------
    def open(self, row: int) -> None:
        """Start an empty hot buffer for request row `row` (any earlier state is dropped)."""
        self._check_row(row)
        self.hot.reset(row)
        self.hot.is_open[row] = True
        self.counters.reset_request(row)

    def close(self, row: int) -> None:
        """Request finished, aborted or retracted: zero and free its hot buffer."""
        self._check_row(row)
        if self.hot.is_open[row]:
            self.hot.reset(row)
            self.hot.is_open[row] = False

    @property
    def open_requests(self) -> int:
        return sum(self.hot.is_open)

    # --- host rows ----------------------------------------------------------------------
    def write_host(self, layer: int, locs: torch.Tensor, rows: torch.Tensor) -> None:
        """rows uint8 [n, row_bytes] -> host pool at `locs` (int64 [n]) of `layer` (D2H)."""
        check_rows(rows, locs.numel(), self.cfg.row_bytes, "write_host")
        self._check_layer(layer)
        locs = locs.to(torch.int64).reshape(-1)
        if locs.numel() and (int(locs.min()) < 0 or int(locs.max()) >= self.cfg.host_capacity_tokens):
            raise IndexError(f"write_host: location out of range [0, {self.cfg.host_capacity_tokens})")
        src_idx = torch.arange(locs.numel(), device=rows.device)
        copy_rows(rows, src_idx, self.host.rows[layer], locs.to(rows.device), self.transfer_backend)
        self.counters.add_d2h(layer, locs.numel())

    def clear_host(self, locs: torch.Tensor) -> None:
        """Zero host rows an engine is about to reuse (rows hold user data)."""
        self.host.clear(locs)

    # --- decode path -------------------------------------------------------------------
    def warmup(self, layer: int, rows: torch.Tensor, seq_lens: torch.Tensor, topk_ids: torch.Tensor,
               req_to_host: torch.Tensor) -> int:
        """LRU warmup before the first decode step (ESS.md §3): touch the top-k sets of the
        prefill's last W query positions, oldest first, exactly as decode steps would, then
        fetch the resulting resident rows in one transfer. A request whose context fits in N
        loads its whole context instead (fast path: it never misses).

        rows int64 [b], seq_lens int64 [b], topk_ids int [b, W, k] (-1 padded).
        Returns the number of rows fetched (host sync: once per request, not per step)."""
        self._check_layer(layer)
        rows = rows.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        self._check_batch(rows)
        if topk_ids.dim() != 3 or topk_ids.shape[0] != rows.numel():
            raise ValueError(f"warmup topk_ids: expected [batch={rows.numel()}, W, k], got "
                             f"{list(topk_ids.shape)}")
        n = self.cfg.hot_slots_per_request
        ids = topk_ids.to(self.device, torch.int64)
        for w in range(ids.shape[1]):
            check_topk(ids[:, w], seq_lens, "warmup topk_ids")
            assign(self.hot, layer, rows, seq_lens, ids[:, w])
        s2t = self.hot.slot_to_token[layer].index_select(0, rows)
        ar = torch.arange(n, device=self.device).expand_as(s2t)
        whole = (seq_lens <= n).unsqueeze(1) & (ar < seq_lens.unsqueeze(1))
        s2t = torch.where(whole, ar, s2t)          # fast path: slot = position, whole context
        self.hot.slot_to_token[layer].index_copy_(0, rows, s2t)
        live = s2t >= 0
        src = torch.where(live, req_to_host.to(self.device)[rows.unsqueeze(1), s2t.clamp(min=0)], -1)
        dst = torch.where(live, ar + rows.unsqueeze(1) * n, -1)
        self._fetch(layer, src.reshape(-1), dst.reshape(-1))
        m = int(live.sum())
        self.counters.add_warmup(layer, m)
        return m

    def resolve(self, layer: int, rows: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                req_to_host: torch.Tensor, validate: bool = True) -> torch.Tensor:
        """Make every top-k entry resident and return where it lives.

        rows:        int64 [b]     request rows (unique, opened)
        seq_lens:    int64 [b]     tokens in each request's context (positions < seq_len valid)
        topk:        int32/int64 [b, k]  token positions, -1 padded
        req_to_host: int64 [max_requests, max_context]  token position -> host location
        returns      int32 [b, k]  row index into `self.hot.layer_rows(layer)`, -1 for padding
        `validate=False` skips the input checks (they sync the host) on a trusted hot path.
        """
        self._check_layer(layer)
        rows = rows.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        if validate:
            self._check_batch(rows)
            check_topk(topk, seq_lens, "resolve topk")
        tokens = topk.to(self.device, torch.int64)
        a = assign(self.hot, layer, rows, seq_lens, tokens)
        n = self.cfg.hot_slots_per_request
        r2h = req_to_host.to(self.device)
        host_src = torch.where(a.miss, r2h[rows.unsqueeze(1), tokens.clamp(min=0)], torch.full_like(tokens, -1))
        dst = torch.where(a.miss, a.slots + rows.unsqueeze(1) * n, torch.full_like(tokens, -1))
        self._fetch(layer, host_src.reshape(-1), dst.reshape(-1))
        self.counters.add_step(layer, rows, a.hit, a.miss)
        out = torch.where(a.slots >= 0, a.slots + rows.unsqueeze(1) * n, a.slots)
        return out.to(torch.int32)

    def append(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, data: torch.Tensor,
               req_to_host: torch.Tensor) -> None:
        """The step's newest latent rows: data uint8 [b, row_bytes] at token `positions` [b]
        -> host pool (write-back) and straight into a hot slot (`admit`)."""
        rows = rows.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        check_rows(data, rows.numel(), self.cfg.row_bytes, "append")
        locs = req_to_host.to(self.device)[rows, positions]
        self.write_host(layer, locs, data)
        self.admit(layer, rows, positions, data)

    def admit(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, data: torch.Tensor,
              validate: bool = True) -> None:
        """Put the newest rows (already written to the host by the engine) into hot slots as the
        most recently used entries, so the step that selects them does not fetch them back.
        rows int64 [b] (unique, open), positions int64 [b], data uint8 [b, row_bytes].
        `validate=False` skips the batch checks (a host sync) on a trusted hot path."""
        self._check_layer(layer)
        rows = rows.to(self.device, torch.int64)
        positions = positions.to(self.device, torch.int64)
        check_rows(data, rows.numel(), self.cfg.row_bytes, "admit")
        if validate:
            self._check_batch(rows)
        a = assign(self.hot, layer, rows, positions + 1, positions.unsqueeze(1))
        n = self.cfg.hot_slots_per_request
        self.hot.layer_rows(layer).index_copy_(0, a.slots[:, 0] + rows * n, data.to(self.device))

    def layer_rows(self, layer: int) -> torch.Tensor:
        return self.hot.layer_rows(layer)

    def usage(self, host_tokens_used: int | None = None) -> dict:
        """Host and hot-buffer occupancy. An engine that hands out host locations with its own
        allocator (SGLang) passes its count as `host_tokens_used`."""
        return {
            "host_tokens_used": self.host.used_tokens if host_tokens_used is None else host_tokens_used,
            "host_tokens_capacity": self.host.capacity_tokens,
            "hot_requests_open": self.open_requests,
            "hot_slots_used": self.hot.used_slots(),
            "hot_slots_capacity": self.cfg.num_layers * self.cfg.hot_slots_total,
            "host_bytes": self.cfg.host_bytes,
            "device_bytes": self.cfg.device_bytes,
        }

    # --- internals -----------------------------------------------------------------------
    def _fetch(self, layer: int, host_locs: torch.Tensor, dev_slots: torch.Tensor) -> None:
        copy_rows(self.host.rows[layer], host_locs, self.hot.layer_rows(layer), dev_slots,
                  self.transfer_backend)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.cfg.num_layers:
            raise IndexError(f"layer {layer} out of range: the store has {self.cfg.num_layers} layers")

    def _check_row(self, row: int) -> None:
        if not 0 <= int(row) < self.cfg.max_requests:
            raise KeyError(f"request row {row} out of range [0, {self.cfg.max_requests}); "
                           "raise --max-running-requests")

    def _check_open(self, row: int) -> None:
        self._check_row(row)
        if not self.hot.is_open[int(row)]:
            raise KeyError(f"request row {row} has no open hot buffer (call open() first, "
                           "or the request already finished)")

    def _check_batch(self, rows: torch.Tensor) -> None:
        rl = rows.tolist()
        for r in rl:
            self._check_open(r)
        if len(set(rl)) != len(rl):
            raise ValueError(f"request rows repeat in one batch: {rl}")
