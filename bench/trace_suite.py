"""Top-k traces for the speculative-prefetch predictors (format: sgl_ess/prefetch/trace_format.py).

  python -m bench trace --out FILE [--requests 4] [--new-tokens 64] [--prompt-repeat 14] [--hot-slots 40]
        starts the embedded server (sgl_ess/models/tiny_dsv32) with --ess-trace-file FILE, sends
        --requests greedy prompts at once, stops it, and prints the trace's adjacent-step overlap
        and exact-LRU misses per layer. The embedded model has RANDOM weights: its top-k says
        nothing about real locality (the trace exercises the recorder and the replay). Pass
        --server-arg ... for anything else (e.g. a real model: --server-arg=--model-path=PATH).
  python -m bench trace --synthetic --out FILE [--layers 61 --k 128 --context 2048 --steps 100
        --requests 2 --ratio 0.2 --seed 0]
        writes a SYNTHETIC trace (sgl_ess/prefetch/synthetic_trace.py) and the same summary, with
        the configured overlap next to the measured one.
The trace file is the result (it is large: it goes where --out says, not to bench/results).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import time
import urllib.request

import numpy as np

from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate, layer_overlap
from sgl_ess.prefetch.trace_format import read_trace, write_trace
from sgl_ess.prefetch.trace_stats import adjacent_overlap, lru_misses


def summarize(path: str, configured: np.ndarray | None = None) -> None:
    trace = read_trace(path)
    ov = adjacent_overlap(trace)
    miss = lru_misses(trace)
    print(f"{path}: source {trace.header.get('source')}, {trace.num_layers} layers, top-k {trace.topk}, "
          f"{sum(1 for _ in trace.plans())} plans; {trace.header.get('note', '')}")
    print("layer  overlap" + ("  configured" if configured is not None else "") + "  lru_misses/request/plan")
    for layer in range(trace.num_layers):
        conf = f"  {configured[layer]:10.3f}" if configured is not None else ""
        print(f"{layer:5d}  {ov[layer]:7.3f}{conf}  {miss[layer]:8.2f}")


def record_from_server(a) -> None:
    from bench.serving_suite import start_server, stop_server

    if os.path.exists(a.out):
        raise SystemExit(f"--out {a.out!r} exists; the recorder refuses to overwrite it")
    args = ["--ess-trace-file", os.path.abspath(a.out), "--ess-hot-slots-per-request", str(a.hot_slots),
            "--max-running-requests", str(max(8, a.requests)), "--max-total-tokens", "32768", *a.server_arg]
    proc, base = start_server(args, a.out + ".server.log")
    try:
        def one(i: int) -> None:
            text = ("class Node%d:\n    def __init__(self, v):\n        self.v = v * %d\n" % (i, i + 3)) * a.prompt_repeat
            body = {"text": text, "sampling_params": {"max_new_tokens": a.new_tokens, "temperature": 0,
                                                      "ignore_eos": True}}
            req = urllib.request.Request(base + "/generate", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(a.requests) as ex:
            list(ex.map(one, range(a.requests)))
        print(f"{a.requests} requests x {a.new_tokens} tokens in {time.monotonic() - t0:.1f} s")
    finally:
        stop_server(proc)
    summarize(a.out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the trace file to write")
    p.add_argument("--synthetic", action="store_true", help="generate a synthetic trace instead of recording one")
    p.add_argument("--requests", type=int, default=None, help="server: concurrent prompts (4); synthetic: requests (2)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-repeat", type=int, default=14, help="server: prompt = a 3-line snippet x this")
    p.add_argument("--hot-slots", type=int, default=40, help="server: --ess-hot-slots-per-request")
    p.add_argument("--server-arg", action="append", default=[], help="server: one more launch_server argument")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--k", type=int, default=128)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--ratio", type=float, default=0.2)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not a.synthetic:
        a.requests = a.requests or 4
        record_from_server(a)
        return 0
    cfg = SyntheticTraceConfig(num_layers=a.layers, topk=a.k, context_tokens=a.context, steps=a.steps,
                               requests=a.requests or 2, seed=a.seed,
                               hot_slots_per_request=max(a.k + 1, round(a.ratio * a.context)))
    write_trace(a.out, generate(cfg))
    summarize(a.out, layer_overlap(cfg))
    return 0
