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


def main(extra: list[str], work=None) -> None:
    """Run SGLang's one_batch correctness test, or `work` (its signature: server_args, port_args, bench_args,
    gpu_id, tp_rank) in its place, in this process."""
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
    if work is not None:
        one_batch.correctness_test = work
    sys.argv = ["one_batch", "--model-path", TINY_DSV4_DIR, "--load-format", "dummy", "--device", "cpu",
                "--correctness-test", "--cut-len", "4", "--output-len", "4", "--batch-size", "1",
                "--max-total-tokens", "4096", "--max-running-requests", "4", "--disable-cuda-graph",
                "--swa-full-tokens-ratio", "0.5", *extra]
    one_batch.cli_main()


def first_token_logits(input_ids: list[int], out_path: str, extra: list[str] = ()) -> None:
    """One prefill of `input_ids` through the model runner in this process (no server); writes the
    float32 next-token logits to `out_path` (torch.save)."""
    import torch

    def work(server_args, port_args, bench_args, gpu_id, tp_rank):
        from sglang.benchmark import one_batch as ob

        ob.publish(server_args, role="scheduler", ranks=ob.SpawnRanks(
            world_rank=ob.spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=0), gpu_id=gpu_id))
        ob._init_process_global_configs()
        runner, _ = ob.load_model(server_args, port_args, gpu_id, tp_rank)
        reqs = ob.prepare_synthetic_inputs_for_latency_test(1, len(input_ids), [input_ids])
        _, logits, _ = runner.extend(reqs)
        torch.save(logits[0].float().clone(), out_path)

    main(list(extra), work)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--first-token-logits"]:
        first_token_logits([int(t) for t in sys.argv[2].split(",")], sys.argv[3], sys.argv[4:])
    else:
        main(sys.argv[1:])
