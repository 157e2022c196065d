"""sgl-ess installs beside SGLang: no requirement of sgl-ess (dependencies and every extra, ``sglang``,
``cuda`` and ``cpu`` included) may exclude a version that the installed SGLang pins (``==``) for the
same package. Read offline: SGLang's requirements from its installed metadata, sgl-ess's from
pyproject.toml (the installed editable metadata can be older than the checkout)."""

from __future__ import annotations

import importlib.metadata
import os
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sglang_pins(requires: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (pinned version, SGLang's requirement line) for each ``==`` pin of SGLang's own
    dependencies. Pins behind a platform marker count (a GPU user may be on that platform); pins of
    SGLang's extras (``extra == ...``) do not: ``sglang==X`` installs none of them."""
    out = {}
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        for spec in req.specifier:
            if spec.operator == "==" and "*" not in spec.version:
                out[canonicalize_name(req.name)] = (spec.version, line)
    return out


def ours(pyproject_text: str) -> list[tuple[str, str]]:
    """(where, requirement line) for every requirement of sgl-ess: dependencies and all extras."""
    project = tomllib.loads(pyproject_text)["project"]
    out = [("dependencies", r) for r in project.get("dependencies", [])]
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out += [(f"extra [{extra}]", r) for r in reqs]
    return out


def conflicts(pyproject_text: str, requires: list[str]) -> list[str]:
    """One line per sgl-ess requirement that excludes the version SGLang pins for that package."""
    pins = sglang_pins(requires)
    bad = []
    for where, line in ours(pyproject_text):
        req = Requirement(line)
        pin = pins.get(canonicalize_name(req.name))
        if pin is not None and not req.specifier.contains(pin[0], prereleases=True):
            bad.append(f"{where}: {line!r} excludes {pin[0]} (SGLang requires {pin[1]!r})")
    return bad


def _installed_sglang_requires() -> list[str]:
    try:
        return importlib.metadata.requires("sglang") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("sglang is not installed in this environment (bash launch/setup.sh)")


def _pyproject() -> str:
    with open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8") as fh:
        return fh.read()


def test_installed_sglang_pins_packages_we_also_require():
    """The check below compares something: SGLang's metadata pins torch (and numba) exactly."""
    pins = sglang_pins(_installed_sglang_requires())
    assert "torch" in pins and "numba" in pins, sorted(pins)


def test_no_requirement_of_sgl_ess_excludes_a_version_sglang_pins():
    assert conflicts(_pyproject(), _installed_sglang_requires()) == []


def test_the_sglang_extra_admits_the_installed_sglang():
    version = importlib.metadata.version("sglang")
    reqs = [Requirement(line) for where, line in ours(_pyproject()) if where == "extra [sglang]"]
    sglang = [r for r in reqs if canonicalize_name(r.name) == "sglang"]
    assert sglang and all(r.specifier.contains(version, prereleases=True) for r in sglang), (version, reqs)


@pytest.mark.parametrize("dependency,extras", [
    ('"torch==2.13.0"', ""),                                   # the pin that made pip's resolution impossible
    ('"torch"', 'cpu = ["numba==0.64.0"]'),                    # an extra that pins another numba
    ('"torch<2.14"', ""),                                      # a ceiling below SGLang's pin
])
def test_a_requirement_that_excludes_sglangs_pin_is_reported(dependency, extras):
    text = f'[project]\nname = "x"\ndependencies = [{dependency}]\n[project.optional-dependencies]\n{extras}\n'
    requires = ["torch==2.14.1", "numba==0.65.1", "numpy", 'av==16.1.0; extra == "diffusion"']
    found = conflicts(text, requires)
    assert len(found) == 1, found
    assert ("2.14.1" in found[0]) or ("0.65.1" in found[0])


def test_an_extra_only_pin_of_sglang_is_not_a_constraint():
    text = '[project]\nname = "x"\ndependencies = ["av==15.0"]\n'
    assert conflicts(text, ['av==16.1.0; extra == "diffusion"']) == []
