"""SpeculativeStager: the speculative prefetch tier of a LatentStore.

After each plan, a predictor (sgl_ess.prefetch.predictors) may name rows a later layer will
probably select. Those not resident in that layer's hot buffers are fetched, tier
"speculative" (spare bandwidth only, dropped past a deadline), into the speculative region of
the slot space for the target layer's parity, each fetch tagged with its own sequence number.
When the target layer plans, its misses that were staged AND whose tag shows they landed are
read from there (no immediate fetch; committed into their LRU slot like ring rows); the rest are
fetched as usual. Nothing here is needed for correctness: a stale, late or dropped staging is
simply not used.

Memory: borrows the store's slot space (spec rows) and engine; owns only the small pending map
(sorted keys -> spec rows) of at most two target layers.
"""
from __future__ import annotations

import time

import torch

from sgl_ess.prefetch.plan import CopyPlan


class SpeculativeStager:
    def __init__(self, store, predictor, deadline_s: float = 0.05):
        self.store = store
        self.predictor = predictor
        self.deadline_s = deadline_s
        self.pending: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}   # target -> keys, rows, seq
        self.fence: dict[int, object] = {}       # parity -> commit ticket of the spec rows' last use
        self.rows_staged = 0
        self.rows_used = 0

    def stats(self) -> dict:
        return {"predictor": self.predictor.name, "rows_staged": self.rows_staged, "rows_used": self.rows_used,
                "precision": (self.rows_used / self.rows_staged) if self.rows_staged else None}

    def _key(self, reqs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return reqs.unsqueeze(1) * self.store.cfg.max_context_tokens + positions

    def after_plan(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                   req_to_host: torch.Tensor) -> None:
        st = self.store
        pred = self.predictor.predict(layer, st.cfg.num_layers, reqs, seq_lens, topk)
        if pred is None:
            return
        target, pos = pred
        pos = pos.to(st.device, torch.int64)
        parity = target % 2
        if parity in self.fence:
            st.engine.wait(self.fence.pop(parity))
        self.pending.pop(target, None)
        n = st.cfg.hot_slots_per_request
        s2t = st.hot.slot_to_token[target].index_select(0, reqs)
        srt = s2t.sort(dim=1).values
        idx = torch.searchsorted(srt, pos.clamp(min=0)).clamp(max=n - 1)
        resident = srt.gather(1, idx) == pos
        want = (pos >= 0) & (pos < seq_lens.unsqueeze(1)) & ~resident & (seq_lens > n).unsqueeze(1)
        keys = self._key(reqs, pos)[want][:st.cfg.spec_slots]
        if keys.numel() == 0:
            return
        keys = torch.unique(keys)                  # sorted, duplicates dropped
        req_of = keys // st.cfg.max_context_tokens
        src = req_to_host.to(st.device)[req_of, keys % st.cfg.max_context_tokens]
        rows = st.slots.spec_row(parity, torch.arange(keys.numel(), device=st.device))
        seq = st.next_seq()
        st.engine.submit(CopyPlan("h2s", src, rows, layer=target, tier="speculative", tag_seq=seq,
                                  deadline_s=time.monotonic() + self.deadline_s, note="speculative"))
        self.pending[target] = (keys, rows, seq)
        self.rows_staged += int(keys.numel())

    def claim(self, layer: int, reqs: torch.Tensor, tokens: torch.Tensor, miss: torch.Tensor) -> torch.Tensor | None:
        """Spec rows that already hold this layer's misses: int64 [b, k] row or -1 (None if none staged)."""
        p = self.pending.pop(layer, None)
        if p is None:
            return None
        keys, rows, seq = p
        st = self.store
        landed = st.slots.ring_tags[rows - st.slots.ring_base] == seq
        want = self._key(reqs, tokens.clamp(min=0))
        idx = torch.searchsorted(keys, want).clamp(max=keys.numel() - 1)
        hit = miss & (keys[idx] == want) & landed[idx]
        self.rows_used += int(hit.sum())
        return torch.where(hit, rows[idx], -1)

    def note_commit(self, layer: int, ticket) -> None:
        if ticket is not None:
            self.fence[layer % 2] = ticket
