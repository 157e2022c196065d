"""SpeculativeStager: the speculative prefetch tier of a LatentStore.

After each plan, a predictor (sgl_ess.prefetch.predictors) may name rows a later layer (or, for the
temporal predictors, the next step's first layer) will probably select. Those not resident in that
layer's hot buffers, at most spec_slots / batch per request in the predictor's order, are fetched,
tier "speculative" (spare bandwidth only), into a contiguous range of the speculative region of the
slot space for the target layer's parity (no other micro-batch's pending staging holds it), each
fetch tagged with its own sequence number. When the target layer plans, its misses that were staged
AND have landed are read from there (no immediate fetch; committed into their LRU slot like ring
rows); the rest are fetched as usual. Nothing here is needed for correctness: a stale, late or
dropped staging is simply not used.

Every shape is static and nothing here reads a device value on the host, so the same code runs on
every engine:
  * host engines (inline, the worker process): "landed" is the row's ring tag; a staging past its
    deadline is dropped; counts are read at once (host tensors);
  * a device-ordered engine (CUDA's side stream, StreamEngine): a staging is queued on the same
    in-order stream as the immediate fetch of every later plan, and the store makes attention read
    claimed rows only after that plan's wait (LatentStore.plan), so a claimed row has always landed
    and no tag is read; the precision counts and - for predictors that run on the host
    (``Predictor.host_inputs``: last_step, score_ema, lstm) - the top-k they learn from reach the
    host through a HostFeed (host_feed.py: an asynchronous copy and an event, never a wait), so
    such a predictor learns from a plan a little after it ran. next_layer reads the device top-k.

A PrecisionGate (sgl_ess.prefetch.precision_gate) watches precision (rows used / rows staged) over
the last --ess-predictor-window claims; below --ess-predictor-min-precision the tier falls back to
plain LRU (nothing staged; the predictions are scored in shadow against the misses) until they are
good again.

Runs on the planning thread (SGLang's scheduler thread), inside `LatentStore.plan`; the
predictor's CPU time is counted in `predict_us`.

Memory: borrows the store's slot space (spec rows) and engine; owns the small pending and shadow
maps (keys -> spec rows) of at most two target layers per micro-batch, per-layer counters on the
device, and the HostFeed queues (host copies of in-flight top-k and counts).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.precision_gate import PrecisionGate
from sgl_ess.store.host_feed import HostFeed


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
        self.held: dict[tuple[int, int], tuple[int, int]] = {}   # -> (first spec slot, count) of its rows
        # claimed rows, read by attention until their step's commit moves them out: a staging made in
        # between (the last layer's prediction for layer 0 has the same parity when the layer count is
        # odd, as DeepSeek-V3.2's 61) must not land in them
        self.in_use: dict[tuple[int, int], tuple[int, int]] = {}  # (layer, micro-batch) -> slot range
        self.shadow: dict[tuple[int, int], torch.Tensor] = {}                               # -> keys (fallback)
        self.born: dict[tuple[int, int], int] = {}          # (target, micro-batch) -> predict_calls at staging
        self.last_call: dict[tuple[int, int], int] = {}     # (parity, micro-batch) -> its last after_plan
        self.fence: dict[int, object] = {}       # parity -> commit ticket of the spec rows' last use
        dev = store.device
        layers = store.cfg.num_layers
        self._staged = torch.zeros(layers, dtype=torch.int64, device=dev)   # rows staged, by target layer
        self._used = torch.zeros(layers, dtype=torch.int64, device=dev)     # of those, read by the target
        self.predict_calls = 0
        self.predict_us = 0.0
        # device-ordered engines: counts summed per gate mode until flushed through a HostFeed
        self._acc = {m: torch.zeros(2, dtype=torch.int64, device=dev) for m in (False, True)}
        self._acc_plans = {False: 0, True: 0}
        self._flush_every = max(1, self.gate.window // 4)
        self._feeds_for = None            # the engine the feeds below were made for (tests swap engines)
        self._inputs: HostFeed | None = None
        self._latest: dict[int, tuple] = {}   # micro-batch -> its latest batch seen by the host predictor
        self._counts: HostFeed | None = None

    # --- counts (device tensors; read only by stats) -----------------------------------------
    @property
    def rows_staged(self) -> int:
        return int(self._staged.sum())

    @property
    def rows_used(self) -> int:
        return int(self._used.sum())

    @property
    def staged_by_layer(self) -> list[int]:
        return self._staged.tolist()

    @property
    def used_by_layer(self) -> list[int]:
        return self._used.tolist()

    def stats(self) -> dict:
        staged, used = self.rows_staged, self.rows_used
        out = {"predictor": self.predictor.name, "rows_staged": staged, "rows_used": used,
               "precision": (used / staged) if staged else None,
               "predict_calls": self.predict_calls, "predict_us": round(self.predict_us, 1),
               "gate": self.gate.stats(), "state": self.predictor.stats()}
        if self._inputs is not None and self._ordered and getattr(self.predictor, "host_inputs", True):
            out["lagged_inputs"] = {"pushed": self._inputs.pushed, "predicted": self._inputs.delivered,
                                    "in_flight": len(self._inputs)}
        return out

    @property
    def _ordered(self) -> bool:
        return self.store.engine.ordered_on_device

    def _feeds(self) -> tuple[HostFeed, HostFeed]:
        eng = self.store.engine
        if self._feeds_for is not eng:
            rt = getattr(eng, "rt", None) if eng.ordered_on_device else None
            self._inputs = HostFeed(rt, self.store.device)
            self._counts = HostFeed(rt, self.store.device)
            self._feeds_for = eng
        return self._inputs, self._counts

    def _key(self, reqs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return reqs.unsqueeze(1) * self.store.cfg.max_context_tokens + positions

    # --- staging --------------------------------------------------------------------------
    def after_plan(self, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
                   req_to_host: torch.Tensor, micro_batch: int = 0) -> None:
        """Layer `layer` planned top-k `topk` [b, k] of requests `reqs` [b]: predict and stage. On a
        device-ordered engine a host predictor learns from each plan's top-k once its copy has
        reached the host (a layer or more later), and forecasts the next layer from that state for
        the latest batch it has seen of this micro-batch - at most one staging per call."""
        if getattr(self.predictor, "host_inputs", True) and self._ordered:
            inputs, _ = self._feeds()
            inputs.push((layer, micro_batch, reqs.to(torch.int64).clone(), seq_lens.to(torch.int64).clone()),
                        (reqs, seq_lens, topk))
            t0 = time.perf_counter()
            for (lay, mb, r_dev, s_dev), (r, s, t) in inputs.ready():
                self.predictor.learn(lay, self.store.cfg.num_layers, r, s, t)
                self._latest[mb] = (r, r_dev, s_dev)
            latest = self._latest.get(micro_batch)
            if latest is None:
                self.predict_us += (time.perf_counter() - t0) * 1e6
                return
            r, r_dev, s_dev = latest
            pred = self.predictor.forecast(layer, self.store.cfg.num_layers, r)
            self.predict_us += (time.perf_counter() - t0) * 1e6
            self.predict_calls += 1
            self._stage(pred, r_dev, s_dev, req_to_host, micro_batch)
            return
        self._predict_and_stage(layer, reqs, seq_lens, topk, req_to_host, micro_batch)

    def _predict_and_stage(self, layer, reqs, seq_lens, topk, req_to_host, micro_batch) -> None:
        t0 = time.perf_counter()
        pred = self.predictor.predict(layer, self.store.cfg.num_layers, reqs, seq_lens, topk)
        self.predict_us += (time.perf_counter() - t0) * 1e6
        self.predict_calls += 1
        self._stage(pred, reqs, seq_lens, req_to_host, micro_batch)

    def _to_device(self, x) -> torch.Tensor:
        """int64 on the store's device; a host array goes through pinned memory without a wait."""
        dev = self.store.device
        x = torch.as_tensor(x)
        if x.device == dev:
            return x.to(torch.int64)
        x = x.to(torch.int64)
        if dev.type == "cuda":
            return x.pin_memory().to(dev, non_blocking=True)
        return x.to(dev)

    def _stage(self, pred, reqs, seq_lens, req_to_host, micro_batch) -> None:
        """Stage a prediction (target layer, positions [b, m]) for requests `reqs` [b] at `seq_lens`."""
        if pred is None:
            return
        st = self.store
        target, pos = pred
        reqs = self._to_device(reqs)
        seq_lens = self._to_device(seq_lens)
        pos = self._to_device(pos)
        parity = target % 2
        # stale, never claimed: this micro-batch's own older stagings of the parity, and another's
        # made before this micro-batch's previous turn on the parity (that one stopped planning)
        prev = self.last_call.get((parity, micro_batch), -1)
        self.last_call[(parity, micro_batch)] = self.predict_calls
        for key in [k for k in self.pending if k[0] % 2 == parity and (k[1] == micro_batch or self.born[k] < prev)]:
            del self.pending[key]
            self.held.pop(key, None)
        self.shadow.pop((target, micro_batch), None)
        b = reqs.numel()
        if pos.numel() == 0 or b == 0:
            return
        n = st.cfg.hot_slots_per_request
        s2t = st.hot.slot_to_token[target].index_select(0, st.groups_of(reqs))
        srt = s2t.sort(dim=1).values
        idx = torch.searchsorted(srt, pos.clamp(min=0)).clamp(max=n - 1)
        resident = srt.gather(1, idx) == pos
        want = (pos >= 0) & (pos < seq_lens.unsqueeze(1)) & ~resident & (seq_lens > n).unsqueeze(1)
        # per request, its share of the rows (the other micro-batches of the layer - the open requests
        # outside this sub-batch - share the same rows), in one contiguous range no other
        # micro-batch's pending staging of the parity holds
        share = min(pos.shape[1], max(1, st.cfg.spec_slots // max(1, b, st.open_requests)))
        lo, share = self._free_range(parity, b, share)
        if share == 0:
            return
        # the first `share` wanted positions of each request, in the predictor's order (static shape)
        first = torch.sort((~want).to(torch.int8), dim=1, stable=True).indices[:, :share]
        sel = pos.gather(1, first)
        ok = want.gather(1, first)
        keys = torch.where(ok, self._key(reqs, sel.clamp(min=0)), -1).reshape(-1)
        if not self.gate.live:
            self.shadow[(target, micro_batch)] = keys
            return
        fence = self.fence.pop(parity, None)
        if fence is not None and not self._ordered:    # a device stream runs the commit before this anyway
            st.engine.wait(fence)
        src = torch.where(ok, req_to_host.to(st.device)[reqs.unsqueeze(1), sel.clamp(min=0)], -1).reshape(-1)
        rows = st.slots.spec_row(parity, torch.arange(lo, lo + b * share, device=st.device))
        seq = st.next_seq()
        # a device stream runs plans in order and nothing is dropped there: claimed rows are read
        # after a later plan's wait (LatentStore.plan); a host engine drops a late staging
        deadline = None if self._ordered else time.monotonic() + self.deadline_s
        st._submit(CopyPlan("h2s", src, torch.where(src >= 0, rows, -1), layer=target, tier="speculative",
                            tag_seq=seq, deadline_s=deadline, note="speculative"))
        self.pending[(target, micro_batch)] = (keys, rows, seq)
        self.held[(target, micro_batch)] = (lo, b * share)
        self.born[(target, micro_batch)] = self.predict_calls
        self._staged[target] += (keys >= 0).sum()

    def _free_range(self, parity: int, b: int, share: int) -> tuple[int, int]:
        """The first free run of spec slots of `parity` for `b` requests x `share` rows (host
        bookkeeping only); `share` shrinks to what the largest free run allows (0: none)."""
        taken = sorted(r for d in (self.held, self.in_use) for k, r in d.items() if k[0] % 2 == parity)
        gaps, at = [], 0
        for lo, cnt in taken:
            gaps.append((at, lo - at))
            at = max(at, lo + cnt)
        gaps.append((at, self.store.cfg.spec_slots - at))
        for lo, size in gaps:
            if size >= b * share:
                return lo, share
        lo, size = max(gaps, key=lambda g: g[1])
        return lo, max(0, size) // b

    # --- claiming -------------------------------------------------------------------------
    def claim(self, layer: int, reqs: torch.Tensor, tokens: torch.Tensor, miss: torch.Tensor,
              micro_batch: int = 0) -> torch.Tensor | None:
        """Spec rows that already hold this (sub-)batch's misses: int64 [b, k] row or -1 (None if
        none staged for this layer and micro-batch). On a device-ordered engine the caller reads
        them after its plan's wait (they are queued before it on the same stream)."""
        self._drain_counts()
        want = self._key(reqs, tokens.clamp(min=0))
        keys = self.shadow.pop((layer, micro_batch), None)
        if keys is not None:                       # fallback: score the prediction, move nothing
            hit, _ = self._match(keys, want, miss)
            self._record(keys, hit.sum(), shadow=True)
        p = self.pending.pop((layer, micro_batch), None)
        rng = self.held.pop((layer, micro_batch), None)
        if p is None:
            return None
        self.in_use[(layer, micro_batch)] = rng        # until note_commit: attention reads these rows
        keys, rows, seq = p
        st = self.store
        landed = None if self._ordered else st.slots.ring_tags[rows - st.slots.ring_base] == seq
        hit, row = self._match(keys, want, miss, rows, landed)
        used = hit.sum()
        self._used[layer] += used
        self._record(keys, used, shadow=False)
        return torch.where(hit, row, -1)

    @staticmethod
    def _match(keys, want, miss, rows=None, landed=None):
        """Which misses `want` [b, k] (keys) are among staged `keys` [m] (-1: empty), and their rows."""
        sk, order = keys.sort()
        idx = torch.searchsorted(sk, want).clamp(max=keys.numel() - 1)
        hit = miss & (sk[idx] == want)
        if landed is not None:
            hit &= landed[order][idx]
        return hit, (rows[order][idx] if rows is not None else None)

    def _record(self, keys: torch.Tensor, used: torch.Tensor, shadow: bool) -> None:
        """One claimed prediction for the precision gate: at once on a host engine; summed on the
        device and read a few claims later (HostFeed) on a device-ordered one."""
        staged = (keys >= 0).sum()
        if not self._ordered:
            self.gate.record(int(staged), int(used), shadow=shadow)
            return
        self._acc[shadow] = self._acc[shadow] + torch.stack([staged, used.to(torch.int64)])
        self._acc_plans[shadow] += 1
        if self._acc_plans[shadow] >= self._flush_every:
            _, counts = self._feeds()
            counts.push((shadow, self._acc_plans[shadow]), (self._acc[shadow],))
            self._acc[shadow] = torch.zeros_like(self._acc[shadow])
            self._acc_plans[shadow] = 0

    def _drain_counts(self) -> None:
        if self._counts is None or not self._ordered:
            return
        for (shadow, plans), (acc,) in self._counts.ready():
            staged, used = acc.tolist()          # a host copy that has landed: no device read
            self.gate.record_window(staged, used, plans, shadow)

    def note_commit(self, layer: int, ticket, micro_batch: int = 0) -> None:
        """The step of (`layer`, `micro_batch`) submitted its commit (`ticket`): its claimed rows are
        free again once that lands (a later staging of the parity waits for it)."""
        self.in_use.pop((layer, micro_batch), None)
        if ticket is not None:
            self.fence[layer % 2] = ticket

    def forget(self, req: int) -> None:
        """Request `req` closed or reopened (the store zeroed every speculative row): drop every
        pending staging, the top-k still on its way to a host predictor, and the predictor's
        state of `req`."""
        self.pending.clear()
        self.held.clear()
        self.in_use.clear()
        self.shadow.clear()
        self.born.clear()
        if self._inputs is not None:
            self._inputs.clear()
        self._latest.clear()
        self.predictor.forget(req)
