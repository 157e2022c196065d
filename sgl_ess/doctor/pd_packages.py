"""What PD (prefill/decode) disaggregation needs on this machine: Mooncake's transfer engine,
libibverbs for its RDMA transport, and SGLang's router. Info only: a single server needs none.

Nothing here imports the packages (find_spec and a dlopen only), so the check stays fast and
cannot be broken by a package that fails at import.
"""
from __future__ import annotations

import ctypes
import glob
import importlib.metadata
import importlib.util
import os
import shutil

from sgl_ess.doctor.finding import Finding

IBVERBS_SONAME = "libibverbs.so.1"


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def can_load(soname: str) -> bool:
    try:
        ctypes.CDLL(soname)
        return True
    except OSError:
        return False


def _version(*dists: str) -> str:
    for d in dists:
        try:
            return f" ({d} {importlib.metadata.version(d)})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return ""


def check_pd(sys_root: str = "/sys", has_module=has_module, can_load=can_load, which=shutil.which) -> list[Finding]:
    out = []
    if has_module("mooncake"):
        out.append(Finding("pd-mooncake", "info", "mooncake importable"
                           + _version("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda")))
    else:
        out.append(Finding("pd-mooncake", "info", "mooncake not installed: needed only for PD disaggregation "
                                                  "(pip install mooncake-transfer-engine, or "
                                                  "mooncake-transfer-engine-non-cuda without CUDA)"))
    ib_dir = os.path.join(sys_root, "class", "infiniband")
    devices = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ib_dir, "*")))
    rdma = f"; RDMA devices: {', '.join(devices)}" if devices else f"; no RDMA devices under {ib_dir}"
    if can_load(IBVERBS_SONAME):
        out.append(Finding("pd-ibverbs", "info", f"{IBVERBS_SONAME} loads{rdma}"))
    else:
        out.append(Finding("pd-ibverbs", "info", f"{IBVERBS_SONAME} not loadable: Mooncake's RDMA transport needs it "
                                                 f"(apt-get install libibverbs1 ibverbs-providers){rdma}"))
    found = [n for n in ("sglang_router", "smg") if has_module(n)] + \
            [f"{n} on PATH" for n in ("smg", "sglang-router") if which(n)]
    if found:
        out.append(Finding("pd-router", "info", f"router: {', '.join(found)}" + _version("sglang-router", "smg")))
    else:
        out.append(Finding("pd-router", "info", "no router (sglang_router / smg module, or smg on PATH): needed "
                                                "only to route between prefill and decode servers "
                                                "(pip install sglang-router)"))
    return out
