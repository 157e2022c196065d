"""SpeculativeStager: the speculative prefetch tier of a LatentStore.

After each plan, a predictor (sgl_ess.prefetch.predictors) may name rows a later layer (or, for the
temporal predictors, the next step's first layer) will probably select. Those not resident in that
layer's hot buffers, at most spec_slots / batch per request in the predictor's order, are fetched,
tier "speculative" (spare bandwidth only, dropped past a deadline), into the speculative region of
the slot space for the target layer's parity, each fetch tagged with its own sequence number. When
the target layer plans, its misses that were staged AND whose tag shows they landed are read from
there (no immediate fetch; committed into their LRU slot like ring rows); the rest are fetched as
usual. Nothing here is needed for correctness: a stale, late or dropped staging is simply not used.

A PrecisionGate (sgl_ess.prefetch.precision_gate) watches precision (rows used / rows staged) over
the last --ess-predictor-window claims; below --ess-predictor-min-precision the tier falls back to
plain LRU (nothing staged; the predictions are scored in shadow against the misses) until they are
good again.

Runs on the planning thread (SGLang's scheduler thread), inside `LatentStore.plan`; the
predictor's CPU time is counted in `predict_us`.

Memory: borrows the store's slot space (spec rows) and engine; owns the small pending and shadow
maps (sorted keys -> spec rows) of at most two target layers, and per-layer counters.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.precision_gate import PrecisionGate


@dataclass(frozen=True)
class SpeculativeOptions:
    """--ess-predictor-checkpoint, --ess-predictor-min-precision, --ess-predictor-window."""
    checkpoint: str = ""
    min_precision: float = 0.1
    window: int = 64


class SpeculativeStager:
    def __init__(self, store, predictor, deadline_s: float = 0.05, options: SpeculativeOptions | None = None):
        options = options or SpeculativeOptions()
        self.store = store
        self.predictor = predictor
        self.deadline_s = deadline_s
        self.gate = PrecisionGate(options.min_precision, options.window)
        # keyed by (target layer, micro-batch): DBA halves / TBO children plan the same layer one after
        # the other, and each claims only what was staged for it
        self.pending: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, int]] = {}   # -> keys, rows, seq
        self.shadow: dict[tuple[int, int], torch.Tensor] = {}                               # -> keys (fallback)
        self.born: dict[tuple[int, int], int] = {}          # (target, micro-batch) -> predict_calls at staging
        self.last_call: dict[tuple[int, int], int] = {}     # (parity, micro-batch) -> its last after_plan
        self.fence: dict[int, object] = {}       # parity -> commit ticket of the spec rows' last use
        self.rows_staged = 0
        self.rows_used = 0
        layers = store.cfg.num_layers
        self.staged_by_layer = [0] * layers      # by target layer
        self.used_by_layer = [0] * layers
        self.predict_calls = 0
        self.predict_us = 0.0

    def stats(self) -> dict:
        return {"predictor": self.predictor.name, "rows_staged": self.rows_staged, "rows_used": self.rows_used,
                "precision": (self.rows_used / self.rows_staged) if self.rows_staged else None,
                "predict_calls": self.predict_calls, "predict_us": round(self.predict_us, 1),
                "gate": self.gate.stats(), "state": self.predictor.stats()}

    def _key(self, reqs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return reqs.unsqueeze(1) * self.store.cfg.max_context_tokens + positions

    def after_plan(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                   req_to_host: torch.Tensor, micro_batch: int = 0) -> None:
        st = self.store
        t0 = time.perf_counter()
        pred = self.predictor.predict(layer, st.cfg.num_layers, reqs, seq_lens, topk)
        self.predict_us += (time.perf_counter() - t0) * 1e6
        self.predict_calls += 1
        if pred is None:
            return
        target, pos = pred
        pos = torch.as_tensor(pos).to(st.device, torch.int64)
        parity = target % 2
        # stale, never claimed: this micro-batch's own older stagings of the parity, and another's
        # made before this micro-batch's previous turn on the parity (that one stopped planning)
        prev = self.last_call.get((parity, micro_batch), -1)
        self.last_call[(parity, micro_batch)] = self.predict_calls
        for key in [k for k in self.pending if k[0] % 2 == parity and (k[1] == micro_batch or self.born[k] < prev)]:
            del self.pending[key]
        self.shadow.pop((target, micro_batch), None)
        if pos.numel() == 0:
            return
        n = st.cfg.hot_slots_per_request
        s2t = st.hot.slot_to_token[target].index_select(0, reqs)
        srt = s2t.sort(dim=1).values
        idx = torch.searchsorted(srt, pos.clamp(min=0)).clamp(max=n - 1)
        resident = srt.gather(1, idx) == pos
        want = (pos >= 0) & (pos < seq_lens.unsqueeze(1)) & ~resident & (seq_lens > n).unsqueeze(1)
        # per request, in the predictor's order; the other micro-batches of the layer (the open
        # requests outside this sub-batch) share the same rows
        share = max(1, st.cfg.spec_slots // max(1, reqs.numel(), st.open_requests))
        want &= want.cumsum(dim=1) <= share
        # rows another micro-batch staged in this parity (not yet claimed) stay its own
        free = torch.ones(st.cfg.spec_slots, dtype=torch.bool, device=st.device)
        for (t, _), (_, held, _) in self.pending.items():
            if t % 2 == parity:
                free[held - st.slots.spec_row(parity, 0)] = False
        slots = torch.nonzero(free).reshape(-1)
        keys = torch.unique(self._key(reqs, pos)[want])[:slots.numel()]   # sorted, duplicates dropped
        if keys.numel() == 0:
            return
        if not self.gate.live:
            self.shadow[(target, micro_batch)] = keys
            return
        if parity in self.fence:
            st.engine.wait(self.fence.pop(parity))
        req_of = keys // st.cfg.max_context_tokens
        src = req_to_host.to(st.device)[req_of, keys % st.cfg.max_context_tokens]
        rows = st.slots.spec_row(parity, slots[:keys.numel()])
        seq = st.next_seq()
        st.engine.submit(CopyPlan("h2s", src, rows, layer=target, tier="speculative", tag_seq=seq,
                                  deadline_s=time.monotonic() + self.deadline_s, note="speculative"))
        self.pending[(target, micro_batch)] = (keys, rows, seq)
        self.born[(target, micro_batch)] = self.predict_calls
        self.rows_staged += int(keys.numel())
        self.staged_by_layer[target] += int(keys.numel())

    def claim(self, layer: int, reqs: torch.Tensor, tokens: torch.Tensor, miss: torch.Tensor,
              micro_batch: int = 0) -> torch.Tensor | None:
        """Spec rows that already hold this (sub-)batch's misses: int64 [b, k] row or -1 (None if
        none staged for this layer and micro-batch)."""
        want = self._key(reqs, tokens.clamp(min=0))
        keys = self.shadow.pop((layer, micro_batch), None)
        if keys is not None:                       # fallback: score the prediction, move nothing
            idx = torch.searchsorted(keys, want).clamp(max=keys.numel() - 1)
            self.gate.record(int(keys.numel()), int((miss & (keys[idx] == want)).sum()), shadow=True)
        p = self.pending.pop((layer, micro_batch), None)
        if p is None:
            return None
        keys, rows, seq = p
        st = self.store
        landed = st.slots.ring_tags[rows - st.slots.ring_base] == seq
        idx = torch.searchsorted(keys, want).clamp(max=keys.numel() - 1)
        hit = miss & (keys[idx] == want) & landed[idx]
        used = int(hit.sum())
        self.rows_used += used
        self.used_by_layer[layer] += used
        self.gate.record(int(keys.numel()), used, shadow=False)
        return torch.where(hit, rows[idx], -1)

    def note_commit(self, layer: int, ticket) -> None:
        if ticket is not None:
            self.fence[layer % 2] = ticket

    def forget(self, req: int) -> None:
        """Request `req` closed or reopened (the store zeroed every speculative row): drop every
        pending staging and the predictor's state of `req`."""
        self.pending.clear()
        self.shadow.clear()
        self.born.clear()
        self.predictor.forget(req)
