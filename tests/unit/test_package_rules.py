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


# --- the data path's stack (issue 16, "one stack, no arrow back up") ---------------------------
STACK = ("integration", "attention", "store", "prefetch", "kernels")     # each imports only rooms below it


def _module_graph():
    """sgl_ess module -> the sgl_ess modules it imports, at the top or inside a function."""
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    graph = {}
    for name, p in mods.items():
        pkg = name if p.name == "__init__.py" else name.rsplit(".", 1)[0]
        out = set()
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = pkg
                    for _ in range(node.level - 1):
                        up = up.rsplit(".", 1)[0]
                    base = up + ("." + node.module if node.module else "")
                cands = [base] + [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            out |= {c for c in cands if c in mods and c != name}
        graph[name] = out
    return graph


def _room(module):
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 else None


def test_the_data_path_stack_has_no_arrow_back_up():
    bad = []
    for mod, deps in _module_graph().items():
        me = _room(mod)
        if me not in STACK:
            continue
        for dep in deps:
            r = _room(dep)
            if r in STACK and STACK.index(r) < STACK.index(me):
                bad.append(f"{mod} -> {dep}")
    assert not bad, f"a room imports one above it ({' -> '.join(STACK)}): {sorted(bad)}"


def test_no_import_cycle_in_the_data_path():
    graph = {m: d for m, d in _module_graph().items() if _room(m) in STACK}
    state, cycles = {}, []

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if d not in graph:
                continue
            if state.get(d) == "open":
                cycles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, f"import cycles (lazy imports included): {cycles}"
