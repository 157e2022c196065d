"""Reading the launcher's SGLang argv (each flag under its full name: sglang_flags.canonical_argv
wrote it) and the parallel layout it asks for. Pure Python, no sglang: the launcher's defaults and
the unit tests use these on plain lists."""

from __future__ import annotations

from sgl_ess.core.parallel_layout import ParallelLayout, shares_host_pool
from sgl_ess.serving.preflight import PreflightError


def has_flag(argv: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def int_flag(argv: list[str], flag: str) -> int | None:
    v = flag_value(argv, flag)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise PreflightError(f"{flag}: got {v!r}; expected an integer")


_ALIASES = {"tp": ("--tp", "--tp-size", "--tensor-parallel-size"), "dp": ("--dp", "--dp-size", "--data-parallel-size"),
            "pp": ("--pp", "--pp-size", "--pipeline-parallel-size"), "nnodes": ("--nnodes",)}


def parallel_layout(argv: list[str]) -> dict:
    """tp, dp, pp, nnodes, dp_attention and ranks_per_node from SGLang's flags (any alias);
    ``--attn-dp-size N`` counts as ``--dp N --enable-dp-attention`` (SGLang 0.5.23's newer spelling)."""
    vals = {}
    for key, flags in _ALIASES.items():
        given = [int_flag(argv, f) for f in flags]
        vals[key] = next((v for v in given if v is not None), 1)
    lay, _ = ParallelLayout.from_sglang(**vals, dp_attention=has_flag(argv, "--enable-dp-attention"),
                                        attn_dp_size=next((v for v in (int_flag(argv, f) for f in (
                                            "--attn-dp-size", "--attention-data-parallel-size")) if v is not None), 1))
    return {"tp": lay.tp, "dp": lay.dp, "pp": lay.pp, "nnodes": lay.nnodes, "dp_attention": lay.dp_attention,
            "ranks_per_node": lay.ranks_per_node}


def pools_per_node(lay: dict, has_cuda: bool, share_mode: str = "auto") -> int:
    """ESS host pools one node allocates: one per attention-TP group on the node when its ranks share it
    (shared_host_pool.py; --ess-share-host-pool: by default on CPU, on CUDA only with `on`), else one per
    rank. The rule itself is sgl_ess.core.parallel_layout, which the capacity planner (sgl_ess.sim plan)
    uses too."""
    return _layout(lay).pools_per_node(shared=shares_host_pool(share_mode, has_cuda))


def _layout(lay: dict) -> ParallelLayout:
    return ParallelLayout(tp=lay["tp"], dp=lay["dp"], pp=lay["pp"], nnodes=lay["nnodes"],
                          dp_attention=lay["dp_attention"])
