"""Part 2 of bench/gpu_check.sh: the embedded tiny DSA model served by SGLang on the GPU, ESS off
vs on. NOT YET RUN: it needs SGLang's CUDA stack, which no machine available so far has had.

  python bench/gpu_serving_check.py [--out PATH] [--dry-run]

Starts `python -m sgl_ess.launch_server` three times on CUDA (FP8 656-byte rows, FlashMLA decode) -
ESS off, ESS on with small hot buffers (eager decode), and the same with decode steps captured in
CUDA graphs (--ess-cuda-graph) - sends the same greedy prompts, and reports per ESS mode whether
the tokens equal ESS off's and the largest log-prob difference (FP8 attention
on a GPU is not bit-reproducible across different kernels' reduction orders, so the log-probs
are reported, not asserted), then a short `sglang.bench_serving` run per mode at one capped device
budget (output tok/s, completed requests).

--dry-run (any machine; what bench/gpu_check.sh --dry-run and CI run): writes the GPU model copy,
resolves both servers' flags through the launcher exactly as on a CUDA machine (ESS config, pool
sizing, filled-in defaults) and, where SGLang is installed, through SGLang's own argument parser;
starts nothing. So a renamed flag fails here, not on the day a GPU is lent.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.meta import run_metadata, write_result  # noqa: E402
from bench.serving_suite import start_server, stop_server  # noqa: E402

COMMON = ["--device", "cuda", "--kv-cache-dtype", "fp8_e4m3", "--page-size", "64", "--cuda-graph-backend-prefill",
          "disabled", "--max-running-requests", "16", "--load-format", "dummy"]
EAGER = ["--cuda-graph-backend-decode", "disabled"]
# FlashMLA's sparse FP8 decode needs DeepSeek-V3.2's attention shapes (512 + 64 latent, 64 or 128
# heads, top-k 2048): the embedded tiny model keeps its depth, width and vocabulary but gets those.
GPU_SHAPES = {"num_attention_heads": 64, "num_key_value_heads": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "qk_nope_head_dim": 128, "v_head_dim": 128, "q_lora_rank": 1536, "index_n_heads": 64,
              "index_head_dim": 128, "index_topk": 2048, "max_position_embeddings": 16384}


def gpu_model(tmp: str) -> str:
    """A copy of the embedded model directory with the attention shapes FlashMLA requires."""
    import shutil

    from sgl_ess.models import TINY_DSV32_DIR

    d = os.path.join(tmp, "tiny_dsv32_gpu")
    shutil.copytree(TINY_DSV32_DIR, d)
    with open(os.path.join(d, "config.json")) as fh:
        cfg = json.load(fh)
    cfg.update(GPU_SHAPES)
    with open(os.path.join(d, "config.json"), "w") as fh:
        json.dump(cfg, fh, indent=1)
    return d
PROMPTS = [("def f%d(x):\n    return x * %d + 1\n" % (i, i)) * 160 for i in range(6)]   # > 2048 tokens


def generate(base: str, text: str) -> list:
    body = {"text": text, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True},
            "return_logprob": True}
    req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        out = json.loads(r.read())
    return [(t[1], t[0]) for t in out["meta_info"]["output_token_logprobs"]]


MODES = {"ess_off": ["--ess-enabled", "false", "--max-total-tokens", "32768", *EAGER],
         "ess_on": ["--ess-hot-slots-per-request", "2560", "--max-total-tokens", "65536", *EAGER],
         # decode steps captured in CUDA graphs (--ess-cuda-graph): checked on CPU by a graph double only
         "ess_on_graphs": ["--ess-hot-slots-per-request", "2560", "--max-total-tokens", "65536",
                           "--ess-cuda-graph", "true", "--cuda-graph-backend-decode", "full"]}


def dry_run(tmp: str) -> dict:
    """Both servers' flags resolved as on a CUDA machine; nothing started."""
    import importlib.util

    from sgl_ess.integration.sglang.launcher.server_args import resolve

    model = gpu_model(tmp)
    with open(os.path.join(model, "config.json")) as fh:
        cfg = json.load(fh)
    out = {"dry_run": True, "model_shapes_applied": all(cfg[k] == v for k, v in GPU_SHAPES.items()), "servers": {}}
    for name, extra in MODES.items():
        _, _, sgl_argv, sizing = resolve(COMMON + ["--model-path", model] + extra, True)
        entry = {"sglang_argv": sgl_argv, "pool": sizing, "sglang_parsed": None}
        if importlib.util.find_spec("sglang") is not None:
            from sglang.srt.server_args import prepare_server_args

            sa = prepare_server_args(sgl_argv)
            entry["sglang_parsed"] = {"device": sa.device, "attention_backend": sa.attention_backend,
                                      "kv_cache_dtype": sa.kv_cache_dtype, "page_size": sa.page_size}
        out["servers"][name] = entry
    return out


def serve(name: str, extra: list[str], tmp: str, model: str) -> dict:
    proc, base = start_server(COMMON + ["--model-path", model] + extra, os.path.join(tmp, f"{name}.log"))
    try:
        outs = [generate(base, p) for p in PROMPTS]
        bench = subprocess.run([sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", base,
                                "--dataset-name", "random", "--random-input-len", "512", "--random-output-len", "32",
                                "--num-prompts", "16", "--output-file", os.path.join(tmp, f"{name}.jsonl")],
                               capture_output=True, text=True, timeout=200)
        stats = {}
        try:
            with open(os.path.join(tmp, f"{name}.jsonl")) as fh:
                last = json.loads(fh.read().strip().splitlines()[-1])
            stats = {k: last.get(k) for k in ("output_throughput", "completed", "concurrency")}
        except (OSError, ValueError, IndexError):
            stats = {"error": bench.stderr[-1500:]}
        return {"outputs": outs, "bench_serving": stats}
    finally:
        stop_server(proc)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", metavar="PATH")
    p.add_argument("--dry-run", action="store_true", help="resolve both servers' flags as on CUDA; start nothing")
    args = p.parse_args()
    if args.dry_run:
        with tempfile.TemporaryDirectory() as tmp:
            res = dry_run(tmp)
        print(json.dumps(res, indent=1))
        if args.out:                      # not a measurement: never into bench/results
            with open(args.out, "w") as fh:
                json.dump({"meta": run_metadata(), **res}, fh, indent=1)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        model = gpu_model(tmp)
        runs = {name: serve(name, extra, tmp, model) for name, extra in MODES.items()}
    off = runs["ess_off"]
    res = {"bench_serving": {name: r["bench_serving"] for name, r in runs.items()}}
    for name, on in runs.items():
        if name == "ess_off":
            continue
        same = [[t for t, _ in a] == [t for t, _ in b] for a, b in zip(off["outputs"], on["outputs"])]
        diffs = [abs(x - y) for a, b in zip(off["outputs"], on["outputs"]) for (_, x), (_, y) in zip(a, b)]
        res[name] = {"tokens_identical_per_request": same, "max_logprob_abs_diff": max(diffs) if diffs else None}
    print(json.dumps(res, indent=1))
    write_result("serving_gpu", res, also_to=args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
