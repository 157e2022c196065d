"""Run a module as the lent GPU machine would: without the packages it does not have.

  python -m bench.gpu_absent MODULE [args...]        e.g. python -m bench.gpu_absent pytest tests/gpu -rA

The device machine that bench/gpu_check.sh runs on has torch, Triton, numpy, pytest and cuda-python,
but no SGLang, sgl-kernel, FlashMLA, FlashInfer or DeepGEMM, and none of the serving side's
messaging packages (pyzmq, orjson) or google-re2. Every step of the check runs under this wrapper,
here and there, so an import of one of them anywhere on a step's path fails in CI's dry run
(`tests/integration/test_gpu_check_dry_run.py`) instead of on the GPU. A blocked import raises
ImportError naming the package; nothing is stubbed.
"""
from __future__ import annotations

import importlib.abc
import runpy
import sys

ABSENT = ("sglang", "sgl_kernel", "flash_mla", "flashinfer", "deep_gemm", "zmq", "orjson", "re2")


class AbsentPackages(importlib.abc.MetaPathFinder):
    """Refuses the top-level packages in `names` (and everything under them)."""

    def __init__(self, names=ABSENT):
        self.names = frozenset(names)

    def find_spec(self, fullname, path=None, target=None):
        top = fullname.partition(".")[0]
        if top in self.names:
            raise ImportError(f"{fullname}: not installed on the lent GPU machine (bench/gpu_absent.py blocks "
                              f"{', '.join(sorted(self.names))} for every step of bench/gpu_check.sh)", name=fullname)
        return None


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(sys.argv) >= 2 else 2
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in ABSENT)
    if loaded:
        raise SystemExit(f"bench.gpu_absent: {loaded} already imported before the block took effect")
    sys.meta_path.insert(0, AbsentPackages())
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
