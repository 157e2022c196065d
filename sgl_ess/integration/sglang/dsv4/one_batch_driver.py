"""Development driver (no server, no lock): SGLang's ``sglang.benchmark.one_batch --correctness-test``
in this process with the sgl-ess plugin loaded as the launcher would (ESS off, no CUDA), on the tiny V4.
It shows where the CPU dsv4 path stops, one traceback at a time:

    python -m sgl_ess.integration.sglang.dsv4.one_batch_driver [extra SGLang flags]

Defaults: tiny_dsv4 with dummy weights (SGLESS_DUMMY_INIT=scaled) and --swa-full-tokens-ratio 0.5 (a
4096-token pool's window pool must hold 128 + 256 tokens). Not a test; tests are tests/integration/test_dsv4_*.py.
"""

from __future__ import annotations

import os
import sys

import sgl_ess.models

TINY_DSV4_DIR = os.path.join(os.path.dirname(os.path.abspath(sgl_ess.models.__file__)), "tiny_dsv4")


def main(extra: list[str]) -> None:
    from sgl_ess.config import ENV_CONFIG_JSON, EssConfig

    os.environ[ENV_CONFIG_JSON] = EssConfig(enabled=False).to_json()
    os.environ.setdefault("SGLESS_DUMMY_INIT", "scaled")
    os.environ["SGLANG_USE_CPU_ENGINE"] = "1"                 # as launcher/process_env.py sets it without CUDA
    os.environ["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] = "0"
    os.environ["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] = "0"
    from sglang.benchmark import one_batch
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sgl_ess.integration.sglang import plugin

    plugin.load_plugin()
    HookRegistry.apply_hooks()
    sys.argv = ["one_batch", "--model-path", TINY_DSV4_DIR, "--load-format", "dummy", "--device", "cpu",
                "--correctness-test", "--cut-len", "4", "--output-len", "4", "--batch-size", "1",
                "--max-total-tokens", "4096", "--max-running-requests", "4", "--disable-cuda-graph",
                "--swa-full-tokens-ratio", "0.5", *extra]
    one_batch.cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
