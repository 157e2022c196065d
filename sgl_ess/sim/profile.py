"""Op profiles: the simulator's primary input for how fast each operator runs on a device.

A profile is one JSON file (format "sgl_ess.op_profile/1"):
  name, hardware (a data/hardware.json entry), device (words), format
  constants  {name: {value, unit, kind, source}}   the structured op model's constants (costs.py)
  tables     {op name: {x_unit, points: [[x, us], ...]}}   measured times, used instead of the model
  model      {name, shape: {...}}     the model shapes the tables were measured at (required with tables)
  base       name of a shipped profile whose constants time the ops a table does not cover (optional)
  meta       provenance written by `python -m bench ops` (command, commit, dirty, versions)
Shipped: data/op_profile_h200_published.json (constants only, built by profile_build.py from published
kernel figures). Measured: bench/results/ops_*.json (tables, written by `python -m bench ops`).
Tables are piecewise linear in x, held at the first point below it and extended along the last segment
above it. A profile with tables is refused for another model's shapes or another --hardware.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .config import ModelSpec, SimConfigError, load_data
from .costs import CostModel
from .hardware import HardwareProfile
from .ops import OpCost

FORMAT = "sgl_ess.op_profile/1"
DEFAULT_PROFILE = "h200_published"
SHIPPED = {"h200_published": "op_profile_h200_published.json"}
CONSTANT_NAMES = ("gemm_compute_eff", "gemm_mem_eff", "roofline_blend_exp", "gemm_m_tile", "sparse_attention_tflops",
                  "mqa_logits_tflops", "indexer_mem_eff", "indexer_blend_exp", "topk_latency_us",
                  "topk_elements_per_s", "deepep_ll_table", "deepep_ll_floor_us", "network_reference_GBps",
                  "compute_reference_bf16_tflops")
X_UNITS = ("tokens", "pairs", "token_keys")


def _bad(source: str, why: str) -> SimConfigError:
    return SimConfigError(f"op profile {source}: {why}; expected a {FORMAT} JSON file (format in "
                          f"sgl_ess/sim/README.md) or one of: {', '.join(SHIPPED)}; fix --op-profile")


@dataclass
class Table:
    x_unit: str
    x: np.ndarray
    us: np.ndarray

    def at(self, x: float) -> float:
        if x <= self.x[0] or len(self.x) == 1:
            return float(self.us[0] if x <= self.x[0] else self.us[-1] * x / self.x[-1])
        if x <= self.x[-1]:
            return float(np.interp(x, self.x, self.us))
        slope = (self.us[-1] - self.us[-2]) / (self.x[-1] - self.x[-2])
        return float(self.us[-1] + max(slope, 0.0) * (x - self.x[-1]))


@dataclass
class OpProfile:
    name: str
    source: str             # for messages (a quoted path, or the shipped name)
    hardware: str
    constants: dict[str, dict] | None
    tables: dict[str, Table] = field(default_factory=dict)
    model_name: str | None = None
    model_shape: dict | None = None
    meta: dict | None = None
    raw: dict | None = None
    spec: str = DEFAULT_PROFILE   # what it was loaded from: OpProfile.load(spec) gives it back

    @classmethod
    def load(cls, spec: str | None = None) -> "OpProfile":
        """`spec`: None (the default shipped profile), a shipped profile's name, or a file path."""
        return _load(spec or DEFAULT_PROFILE)

    def check(self, model: ModelSpec, hw: HardwareProfile) -> None:
        """Refuse a profile whose tables were measured at other shapes or on other hardware."""
        if not self.tables:
            return
        if self.model_shape != model.shape_signature():
            diff = [f"{k} {self.model_shape.get(k)} vs {v}" for k, v in model.shape_signature().items()
                    if self.model_shape.get(k) != v] if self.model_shape else ["no model shape recorded"]
            raise SimConfigError(f"op profile {self.source}: its tables were measured at model {self.model_name!r} "
                                 f"shapes, the simulated model is {model.name!r} ({'; '.join(diff[:4])}); expected "
                                 f"a profile measured at the simulated model's shapes; fix --op-profile or --model")
        if self.hardware != hw.name:
            raise SimConfigError(f"op profile {self.source}: measured on hardware {self.hardware!r}, simulating "
                                 f"{hw.name!r}; expected the same device; fix --hardware or --op-profile")

    def cost_model(self, hw: HardwareProfile) -> CostModel | None:
        return CostModel(self.constants, hw) if self.constants else None

    def timer(self, hw: HardwareProfile, ep: int) -> "OpTimer":
        return OpTimer(self, self.cost_model(hw), ep)


class OpTimer:
    """Times ops for one (profile, hardware, EP): a measured table if the profile has one, else the model."""

    def __init__(self, profile: OpProfile, model: CostModel | None, ep: int):
        self.profile, self.model, self.ep = profile, model, ep

    def time_us(self, op: OpCost) -> float:
        tab = self.profile.tables.get(op.name)
        if tab is not None:
            if tab.x_unit != op.x_unit:
                raise _bad(self.profile.source, f"table {op.name!r} is indexed by {tab.x_unit!r}, the simulator "
                                                f"indexes that op by {op.x_unit!r}")
            return tab.at(op.x)
        if self.model is None:
            if op.kind in ("dispatch", "combine") and op.net_bytes == 0:
                return 0.0
            raise _bad(self.profile.source, f"no table for op {op.name!r} and no constants (or base) to model it")
        return self.model.time_us(op, self.ep)


def _read(path: Path, source: str) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise _bad(source, f"could not read ({e.strerror or e})") from None
    except json.JSONDecodeError as e:
        raise _bad(source, f"not valid JSON ({e.msg} at line {e.lineno})") from None


def _tables(d: dict, source: str) -> dict[str, Table]:
    out = {}
    for name, t in (d.get("tables") or {}).items():
        if not isinstance(t, dict) or t.get("x_unit") not in X_UNITS or not t.get("points"):
            raise _bad(source, f"table {name!r} needs x_unit in {X_UNITS} and a non-empty points list")
        try:
            pts = np.asarray(sorted((float(x), float(us)) for x, us in t["points"]), dtype=float)
        except (TypeError, ValueError):
            raise _bad(source, f"table {name!r}: points must be [[x, us], ...] numbers") from None
        if (pts < 0).any() or len(np.unique(pts[:, 0])) != len(pts):
            raise _bad(source, f"table {name!r}: x and us must be >= 0 and each x listed once")
        out[name] = Table(t["x_unit"], pts[:, 0], pts[:, 1])
    return out


def _constants(d: dict, source: str) -> dict | None:
    consts = d.get("constants") or None
    if consts is None and d.get("base"):
        if d["base"] not in SHIPPED:
            raise _bad(source, f"base {d['base']!r} is not a shipped profile")
        consts = _load(d["base"]).constants
    if consts is not None:
        missing = [n for n in CONSTANT_NAMES if n not in consts or "value" not in consts[n]]
        if missing:
            raise _bad(source, f"constants lack {', '.join(missing)}")
    return consts


@lru_cache(maxsize=32)
def _load(spec: str) -> OpProfile:
    if spec in SHIPPED:
        d, source = load_data(SHIPPED[spec]), spec
    else:
        path = Path(spec)
        if not path.exists():
            raise _bad(repr(spec), "no such file and not a shipped profile name")
        d, source = _read(path, repr(spec)), repr(spec)
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise _bad(source, f"format is {d.get('format') if isinstance(d, dict) else None!r}, not {FORMAT!r}")
    if not d.get("hardware"):
        raise _bad(source, "no 'hardware' (the data/hardware.json entry it describes)")
    tables = _tables(d, source)
    model = d.get("model") or {}
    if tables and not model.get("shape"):
        raise _bad(source, "has tables but no model.shape (the shapes they were measured at)")
    consts = _constants(d, source)
    if consts is None and not tables:
        raise _bad(source, "has neither constants nor tables")
    return OpProfile(name=d.get("name", source), source=source, hardware=d["hardware"], constants=consts,
                     tables=tables, model_name=model.get("name"), model_shape=model.get("shape"),
                     meta=d.get("meta"), raw=d, spec=spec)
