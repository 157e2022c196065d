"""WarmStart: prefill warm-up of a LatentStore's LRU state (a mixin of LatentStore).

Without it a request's first decode step misses on nearly all of its k entries in every layer. Prefill
warm-up sets each (layer, request) LRU to the state an exact LRU ends in after the top-k sets of the
prefill's last W query positions (oldest first), in closed form (warm_state.py), and fetches the rows
it holds in one background move that the layer's first plan waits for (ESS.md §3,
"LRU warmup"). A PD prefill node can instead ship the state itself: `lru_tokens` on the prefill side,
`warm_from_lru_tokens` on the decode side. The methods use the LatentStore's state (cfg, device, hot,
_table, _grouped, _group_host, _row_open, _layer_fence, counters, trace) and helpers (`_check_layer`,
`_check_open`, `_check_batch`, `groups_of`, `_hot_abs`, `_submit`).
"""
from __future__ import annotations

import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.store.validate import check_topk, check_topk_shape, topk_invalid
from sgl_ess.store.warm_state import lru_tokens, set_warm_state, state_from_lru_tokens


class WarmStart:
    def warmup(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk_ids: torch.Tensor,
               req_to_host: torch.Tensor, validate: bool = True) -> torch.Tensor:
        """LRU warmup before the first decode step (ESS.md §3): the state an exact LRU ends in after
        the top-k sets of the prefill's last W query positions, oldest first (set in closed form,
        warm_state.py), then the resident rows fetched in one background move (the layer's first
        plan waits for it). A request whose context fits in N loads its whole context (fast path).
        Replaces the requests' LRU state (call it after `open`).

        reqs int64 [b], seq_lens int64 [b], topk_ids int [b, W, k] (-1 padded).
        Returns the number of rows fetched, int64 0-d on the store's device (read it back only if needed:
        a prefill layer calls this). `validate`: check that the rows are open, in range and unique and the
        top-k inside each context (`_check_warmup`: one host read on the CPU, a device-side assert on CUDA);
        False skips it on a trusted path. With a device-stream engine nothing else reads the device here."""
        self._check_layer(layer)
        reqs = reqs.to(self.device, torch.int64)
        seq_lens = seq_lens.to(self.device, torch.int64)
        if topk_ids.dim() != 3 or topk_ids.shape[0] != reqs.numel():
            raise ValueError(f"warmup topk_ids: expected [batch={reqs.numel()}, W, k], got "
                             f"{list(topk_ids.shape)}")
        ids = topk_ids.to(self.device, torch.int64)
        if reqs.numel() == 0:
            return torch.zeros((), dtype=torch.int64, device=self.device)
        if validate:
            self._check_warmup(reqs, seq_lens, ids.reshape(ids.shape[0], -1))
        if self.trace is not None:
            self.trace.warmup(layer, reqs, seq_lens, ids)
        if self.cfg.anchors[layer] != layer:
            # a shared-index layer: its anchor (warmed first, from the same top-k sets) set the group's
            # table; only this layer's rows are fetched
            s2t = self.hot.slot_to_token[self._table[layer]].index_select(0, self.groups_of(reqs))
        else:
            s2t = set_warm_state(self.hot, self._table[layer], self.groups_of(reqs), seq_lens, ids)
        return self._fetch_residents(layer, reqs, s2t, req_to_host, "warmup")

    def _check_warmup(self, reqs: torch.Tensor, seq_lens: torch.Tensor, ids: torch.Tensor) -> None:
        """warmup's input checks, folded into one device boolean (no host read to build it): every row of
        `reqs` int64 [b] in range, open and once in the batch; every entry of `ids` int64 [b, W*k] below its
        row's seq_len and >= -1. On the CPU one read, then the clear error of the check that failed
        (`_check_batch`, `check_topk`); on CUDA a device-side assert (`torch._assert_async`: CUDA does not
        carry the message, a failed assert stops the process at its next sync; rerun on the CPU to see it)."""
        check_topk_shape(ids, seq_lens, "warmup topk_ids")
        r_max = self.cfg.max_requests
        open_rows = self._row_open
        if self.device.type == "cuda":    # pinned, then without blocking: a pageable copy would wait
            open_rows = open_rows.pin_memory().to(self.device, non_blocking=True)
        elif self.device.type != "cpu":
            open_rows = open_rows.to(self.device)
        rows = reqs.clamp(0, r_max - 1)
        seen = torch.zeros(r_max, dtype=torch.int64, device=self.device).index_add_(0, rows, torch.ones_like(rows))
        bad = (~((reqs >= 0) & (reqs < r_max) & open_rows[rows])).any() | (seen > 1).any()
        bad = bad | topk_invalid(ids, seq_lens)
        if self.device.type == "cuda":
            torch._assert_async(~bad, "warmup: a request row out of range, not open or repeated in the batch, or a "
                                      "top-k position outside its context (the CPU device names which)")
            return
        if bool(bad):                     # the one host read; the error path reads more to say what is wrong
            self._check_batch(reqs)
            check_topk(ids, seq_lens, "warmup topk_ids")
            raise AssertionError("warmup: the folded check failed but no single check did")

    def _fetch_residents(self, layer: int, reqs: torch.Tensor, s2t: torch.Tensor, req_to_host: torch.Tensor,
                         note: str) -> torch.Tensor:
        """Fetch the rows a warm state `s2t` [b, N] holds into the hot slots, in one background move
        that the layer's first plan waits for: one entry per (request, slot), -1 where the slot is empty
        (static shapes: no host read on a device-stream engine; `_submit` compacts for the others).
        Returns the number of rows, int64 0-d on the store's device."""
        ar = torch.arange(self.cfg.hot_slots_per_request, device=self.device).expand_as(s2t)
        live = s2t >= 0
        src = torch.where(live, req_to_host.to(self.device)[reqs.unsqueeze(1), s2t.clamp(min=0)], -1)
        dst = torch.where(live, self._hot_abs(layer, self.groups_of(reqs), ar), -1)
        plan = CopyPlan("h2s", src.reshape(-1), dst.reshape(-1), layer=layer, tier="background", note=note)
        self._layer_fence.setdefault(layer, []).append(self._submit(plan))
        m = live.sum()
        self.counters.add_warmup(layer, m)
        return m

    def lru_tokens(self, req: int) -> torch.Tensor:
        """int64 [num_layers, N] on the host: request `req`'s LRU state as tokens, least recently used
        first (-1 empty); `warm_from_lru_tokens` rebuilds it (a PD prefill node sends it to the decode)."""
        self._check_open(req)
        return lru_tokens(self.hot, self._group_host[req])[self._table].cpu()

    def warm_from_lru_tokens(self, req: int, seq_len: int, tokens: torch.Tensor, req_to_host: torch.Tensor) -> int | None:
        """Set request `req`'s hot buffer (opened, empty) to the LRU state `tokens` [num_layers, N]
        (`lru_tokens` of another store with the same N) and fetch its rows in one background move per
        layer. Returns the rows fetched, or None (state unchanged) when `tokens` is not a valid LRU state
        for `seq_len` tokens: the request stays cold."""
        self._check_open(req)
        n = self.cfg.hot_slots_per_request
        if tokens.shape != (self.cfg.num_layers, n):
            return None
        state = state_from_lru_tokens(tokens.to(self.device), int(seq_len), n)
        if state is None:
            return None
        s2t, order = state
        if self._grouped:
            lead = sorted(set(self.cfg.anchors))
            table = torch.tensor(self._table, device=s2t.device)
            if not torch.equal(s2t, s2t[lead][table]):
                return None                    # a group's layers must hold one state (their anchor's)
            s2t, order = s2t[lead], order[lead]
        g = self._group_host[req]
        self.hot.slot_to_token[:, g] = s2t
        self.hot.lru_order[:, g] = order
        s2t = s2t[self._table] if self._grouped else s2t
        reqs = torch.tensor([req], dtype=torch.int64, device=self.device)
        return int(sum(self._fetch_residents(layer, reqs, s2t[layer:layer + 1], req_to_host, "warmup (PD transfer)")
                       for layer in range(self.cfg.num_layers)))
