"""The simulator's non-device constants, read from data/constants.json (device and kernel rates live in
the op profile, see profile.py).

`kind` in the JSON says how a value was obtained: "paper" (a number the ESS paper states, read as
printed), "prior" (an engineering assumption stated openly, never tuned to a held-out point) or
"fitted" (solved on the first Table 2 row only, see fit.py). Code reads constants only through
`const(name)` so a grep finds every use; `overridden(...)` swaps values temporarily (the fit and the
sensitivity sweeps).
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

from .config import SimConfigError, load_data

_OVERRIDES: dict[str, object] = {}


@lru_cache(maxsize=None)
def all_constants() -> dict[str, dict]:
    return {k: v for k, v in load_data("constants.json").items() if not k.startswith("_")}


def override_of(name: str):
    """The value `overridden()` currently sets for `name`, or None."""
    return _OVERRIDES.get(name)


def const(name: str):
    if name in _OVERRIDES:
        return _OVERRIDES[name]
    return all_constants()[name]["value"]


@contextmanager
def overridden(**values) -> Iterator[None]:
    """Temporarily replace constants by name (unknown names are an error, not a silent no-op)."""
    unknown = sorted(set(values) - set(all_constants()))
    if unknown:
        raise SimConfigError(f"unknown constant(s) {unknown}; expected names from data/constants.json")
    saved = dict(_OVERRIDES)
    _OVERRIDES.update(values)
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _OVERRIDES.update(saved)
