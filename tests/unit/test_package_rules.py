"""The package's room boundaries (STYLE.md): core/ and sim/ import no torch/sglang/triton,
only integration/sglang imports sglang, and only kernels/ imports triton."""
import ast
import pathlib

PKG = pathlib.Path(__file__).resolve().parents[2] / "sgl_ess"


def _imports(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


def _offenders(predicate, banned):
    bad = []
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG).as_posix()
        if predicate(rel):
            hits = banned & set(_imports(p))
            if hits:
                bad.append(f"{rel}: {sorted(hits)}")
    return bad


def test_core_and_sim_are_pure_python():
    bad = _offenders(lambda r: r.startswith(("core/", "sim/")), {"torch", "sglang", "triton"})
    assert not bad, f"core/ and sim/ must not import torch/sglang/triton: {bad}"


def test_only_integration_imports_sglang():
    bad = _offenders(lambda r: not r.startswith("integration/sglang/"), {"sglang"})
    assert not bad, f"sglang imported outside sgl_ess/integration/sglang: {bad}"


def test_only_kernels_import_triton():
    bad = _offenders(lambda r: not r.startswith("kernels/"), {"triton"})
    assert not bad, f"triton imported outside sgl_ess/kernels: {bad}"
