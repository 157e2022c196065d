"""Every SGLang symbol sgl-ess patches or plugs into exists in the pinned SGLang."""

import pkgutil

import pytest

sglang = pytest.importorskip("sglang")

from sgl_ess.integration.sglang import targets  # noqa: E402

pytestmark = pytest.mark.integration


def _resolve(dotted):
    mod_path, attr = dotted.rsplit(".", 1)
    obj = pkgutil.resolve_name(mod_path)
    if isinstance(obj, type) and attr == "kv_buffer":
        return obj  # instance attribute; the class is what must exist
    return getattr(obj, attr)


def test_pinned_sglang_version():
    assert sglang.__version__ == targets.SGLANG_VERSION, (
        f"sgl-ess is pinned to SGLang {targets.SGLANG_VERSION}, found {sglang.__version__}: re-check every "
        "entry of sgl_ess/integration/sglang/targets.py and patches/README.md")


@pytest.mark.parametrize("target", sorted(targets.PATCHED) + sorted(targets.SEAMS))
def test_target_exists(target):
    try:
        _resolve(target)
    except (ImportError, AttributeError, ValueError) as e:
        pytest.fail(f"SGLang {sglang.__version__} no longer has {target} ({type(e).__name__}: {e}); "
                    f"sgl-ess uses it for: {targets.PATCHED.get(target) or targets.SEAMS.get(target)}")


def test_every_patch_is_documented():
    import pathlib

    readme = (pathlib.Path(__file__).resolve().parents[2] / "patches" / "README.md").read_text()
    missing = [t for t in targets.PATCHED if t not in readme]
    assert not missing, f"patches/README.md does not explain: {missing}"
