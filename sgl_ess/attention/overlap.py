"""Decode attention over the store with the fetch hidden behind compute, per overlap level.

  none  plan -> wait for the misses -> attention over all k entries -> commit
  da    dual attention: Attn0 over the resident entries runs while the misses are in flight;
        Attn1 over the misses when they land; the two are merged by log-sum-exp
  dba   dual-batch attention: the batch is split in two (micro-batches 0 and 1, own ring
        groups); both fetches are submitted first, then each half runs DA, so half 1's fetch
        also hides behind half 0's attention. When the caller planned the halves earlier (right
        after each half's indexer), the fetch hides behind the indexer too.
  full  a per-layer choice of the above from an offline profile (OverlapProfile)

`attend(q, slot_rows, slots) -> (out fp32 [T, h, R], lse fp32/fp64 [T, h])` is the device
layer's sparse MLA kernel (torch reference on CPU, Triton / FlashMLA on CUDA); slots int32
[T, k] are rows of `slot_rows`, -1 excluded. This module only decides what runs when.

Learnable attention sinks (Hunyuan V4): an `attend` wrapped in `SinkAttend` computes each partial
attention without the sink; `attend_step` adds the sink exactly once, to the (merged) attention of
the whole step (reference.with_sink), so DA's two parts and the unsplit attention agree.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import torch

from sgl_ess.attention.reference import merge_lse, with_sink
from sgl_ess.config import OVERLAP_LEVELS as LEVELS   # defined once, with the flag
from sgl_ess.store.step_plan import StepPlan

LAYER_MODES = ("none", "da", "dba")
PROFILE_FORMAT = "sgl_ess.overlap_profile/1"

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class SinkAttend:
    """An `Attend` whose attention has a learnable sink per head (float [h]). Calling it runs the
    kernel without the sink (a partial attention); `attend_step` adds `sink` once, after the merge."""

    def __init__(self, attend: Attend, sink: torch.Tensor):
        self.attend = attend
        self.sink = sink

    def __call__(self, q, slot_rows, slots):
        return self.attend(q, slot_rows, slots)


@dataclass
class OverlapProfile:
    """Per-layer overlap mode, measured offline (`python -m bench prefetch --write-profile FILE`)."""

    modes: list[str]
    source: dict = field(default_factory=dict)

    def mode(self, layer: int, num_layers: int | None = None) -> str:
        """Mode of `layer`; a profile measured on a different depth is stretched to `num_layers`
        (the per-layer miss profile keeps its shape, ESS.md §3)."""
        if num_layers and num_layers != len(self.modes):
            layer = min(len(self.modes) - 1, layer * len(self.modes) // num_layers)
        return self.modes[min(layer, len(self.modes) - 1)]

    @classmethod
    def load(cls, path: str) -> "OverlapProfile":
        try:
            with open(path) as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise ValueError(f"overlap profile {path!r} does not exist; write one with "
                             "`python -m bench prefetch --write-profile FILE` (--ess-overlap-profile)") from None
        except ValueError as e:
            raise ValueError(f"overlap profile {path!r} is not JSON: {e}") from None
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"overlap profile {path!r}: expected format {PROFILE_FORMAT!r}, got "
                             f"{data.get('format') if isinstance(data, dict) else type(data).__name__!r}")
        modes = data.get("layers")
        if not modes or any(m not in LAYER_MODES for m in modes):
            raise ValueError(f"overlap profile {path!r}: 'layers' must list one of {', '.join(LAYER_MODES)} "
                             f"per layer, got {modes!r}")
        return cls(list(modes), data.get("source", {}))

    def to_json(self) -> str:
        return json.dumps({"format": PROFILE_FORMAT, "layers": self.modes, "source": self.source}, indent=1)


def layer_mode(level: str, layer: int, profile: OverlapProfile | None, num_layers: int | None = None,
               synchronous: bool = False) -> str:
    """The schedule of `layer` at `level`. With a synchronous engine (the fetch is done when submit
    returns) there is nothing to overlap: DA's split attention and DBA's two resolver passes would
    only add work, so every layer runs 'none' (same outputs; the configured level is kept)."""
    if level not in LEVELS:
        raise ValueError(f"overlap level {level!r}: expected one of {', '.join(LEVELS)}")
    if synchronous:
        return "none"
    if level != "full":
        return level
    if profile is None:
        raise ValueError("overlap level 'full' needs a per-layer profile: --ess-overlap-profile FILE "
                         "(write one with `python -m bench prefetch --write-profile FILE`)")
    return profile.mode(layer, num_layers)


def split_halves(b: int) -> list[slice]:
    """DBA's two halves of a batch of b requests (one half when b < 2)."""
    if b < 2:
        return [slice(0, b)]
    h = (b + 1) // 2
    return [slice(0, h), slice(h, b)]


def only(slots: torch.Tensor, keep: torch.Tensor, static_width: bool = False) -> torch.Tensor:
    """The entries of `slots` [T, k] selected by `keep` (others -1). On the CPU the kept entries
    are also moved to the front, in order, and the table cut to the longest row, so each of DA's
    two partial attentions reads and scores only its own rows (a masked full-width pass would do
    the whole attention twice). On a device, or for a kernel that needs `static_width` (FlashMLA:
    index_topk columns; the CUDA class, also in its GPU fake on CPU), the width stays k and the kept
    entries keep their columns: static shapes, no host sync."""
    sel = torch.where(keep, slots, torch.full_like(slots, -1))
    if static_width or slots.device.type != "cpu" or slots.numel() == 0:
        return sel
    live = sel >= 0
    width = int(live.sum(dim=1).max())
    order = torch.argsort((~live).to(torch.int8), dim=1, stable=True)[:, :max(width, 1)]
    return sel.gather(1, order)


def attend_step(store, step: StepPlan, q: torch.Tensor, attend: Attend, dual: bool,
                on_event: Callable[[str, StepPlan], None] | None = None, static_width: bool = False) -> torch.Tensor:
    """Attention for one planned (sub-)batch; commits the plan afterwards. Returns out fp32 [T, h, R].
    `static_width`: DA's two slot tables keep the full width (`only`)."""
    rows = store.slot_rows
    note = on_event or (lambda what, s: None)
    if not dual or step.landed:
        note("wait", step)
        store.land(step)
        note("attn", step)
        out, lse = attend(q, rows, step.read_slots)
    else:
        note("attn0", step)
        o0, l0 = attend(q, rows, only(step.read_slots, ~step.staged, static_width))
        note("wait", step)
        store.land(step)
        note("attn1", step)
        o1, l1 = attend(q, rows, only(step.read_slots, step.staged, static_width))
        out, lse = merge_lse(o0, l0, o1, l1)
    sink = attend.sink if isinstance(attend, SinkAttend) else None
    if sink is not None:
        if lse is None:
            raise RuntimeError("ESS: an attention with learnable sinks needs the kernel's log-sum-exp to add "
                               "them once after the merge; this kernel returned none (pass the sink to a "
                               "single-call kernel instead)")
        out, _ = with_sink(out, lse, sink)
    store.commit(step)
    note("commit", step)
    return out


def plan_layer(store, mode: str, layer: int, reqs: torch.Tensor, seq_lens: torch.Tensor, topk: torch.Tensor,
               req_to_host: torch.Tensor, validate: bool = True, micro_batch_base: int = 0,
               padded: bool = False) -> list[StepPlan]:
    """Submit the layer's fetches the way `mode` wants them (one plan, or one per DBA half).
    `padded`: `reqs` may hold -1 for padding rows (store.plan)."""
    if mode == "dba":
        return [store.plan(layer, reqs[s], seq_lens[s], topk[s], req_to_host, micro_batch=micro_batch_base + i,
                           validate=validate, padded=padded) for i, s in enumerate(split_halves(reqs.numel()))]
    return [store.plan(layer, reqs, seq_lens, topk, req_to_host, micro_batch=micro_batch_base, validate=validate,
                       padded=padded)]


def decode_layer(store, mode: str, q: torch.Tensor, steps: list[StepPlan], attend: Attend,
                 on_event: Callable[[str, StepPlan], None] | None = None, static_width: bool = False) -> torch.Tensor:
    """Run the layer's attention over its planned steps (consecutive slices of the batch, in
    order) and return out fp32 [T, h, R] for the whole batch. `static_width`: see `only`."""
    outs = []
    start = 0
    for step in steps:
        b = step.reqs.numel()
        outs.append(attend_step(store, step, q[start:start + b], attend, dual=mode in ("da", "dba"),
                                on_event=on_event, static_width=static_width))
        start += b
    return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
