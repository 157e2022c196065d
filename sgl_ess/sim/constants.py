"""Every tuned constant and stated prior of the simulator, read from data/tuned_constants.json.

`kind` in the JSON says how a value was obtained: "fitted" (solved on the two Table 2 calibration
rows only, see calibrate.py), "paper" (a number the paper states), or "prior" (an engineering
assumption stated openly). Code reads constants only through `const(name)` so a grep finds every use;
`overridden(...)` swaps values temporarily (calibration fits and sensitivity sweeps).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

from .config import SimConfigError, load_data

_OVERRIDES: dict[str, object] = {}


@lru_cache(maxsize=None)
def all_constants() -> dict[str, dict]:
    return {k: v for k, v in load_data("tuned_constants.json").items() if not k.startswith("_")}


def const(name: str):
    if name in _OVERRIDES:
        return _OVERRIDES[name]
    return all_constants()[name]["value"]


@contextmanager
def overridden(**values) -> Iterator[None]:
    """Temporarily replace constants by name (unknown names are an error, not a silent no-op)."""
    unknown = sorted(set(values) - set(all_constants()))
    if unknown:
        raise SimConfigError(f"unknown constant(s) {unknown}; expected names from data/tuned_constants.json")
    saved = dict(_OVERRIDES)
    _OVERRIDES.update(values)
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)
