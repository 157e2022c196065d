"""Step 4 of bench/gpu_check.sh: the resolver and the plan epilogue, microseconds per layer-step at the
paper's shapes (batch 64, k 2048, N 6400, context 32K, 85% step-to-step top-k overlap).

  python -m bench.gpu_step_kernels --out PATH [--device cuda] [--batch 64 --k 2048 --slots 6400 ...]

Resolver: bench/kernels_bench.py's own measurements (the Triton kernel eagerly, replayed from a
CUDA graph, and a few block configurations; the torch path eagerly). Plan epilogue
(sgl_ess/kernels/plan_epilogue_triton.py, everything `LatentStore.plan` does after the resolver):
fed with the resolver's real output of each step (its slots, misses and hits over the same
top-k trace), timed eagerly and replayed from a CUDA graph; the first replay's outputs are
compared with the torch reference (step_plan.plan_epilogue_torch) entry for entry. CUDA events,
median and spread over steps after 2 warm-up steps. On a CPU (the dry run) only the torch paths
run, wall clock at tiny shapes, not a measurement; the Triton parts record a skip.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from bench.kernels_bench import (RESOLVER_CONFIGS, _buffers, _stats_us, _timed_cpu, _timed_cuda, resolver_eager,
                                 resolver_graph)
from bench.store_bench import trace
from bench.workload_args import add_workload_args, apply_threads
from sgl_ess.obs.counters import StoreCounters
from sgl_ess.store.resolver import assign
from sgl_ess.store.step_plan import plan_epilogue_torch

WARMUP_STEPS = 2


def epilogue_inputs(args, tr):
    """Per step: (slots, miss, hit, tokens) from the real resolver over trace `tr`, plus the fixed args."""
    buf, reqs, lens = _buffers(args)
    steps = []
    for s in range(tr.shape[0]):
        tok = tr[s].to(args.device)
        a = assign(buf, 0, reqs, lens, tok, backend="torch")
        steps.append((a.slots, a.miss, a.hit, tok))
    r2h = torch.arange(args.batch * args.context, device=args.device).view(args.batch, args.context)
    ring_cap = max(args.k, args.batch * args.k // 8)            # StoreConfig.ring_slots_per_group
    kw = dict(hot_base=0, n_slots=args.slots, ring_first=args.batch * args.slots, ring_cap=ring_cap)
    return steps, reqs, r2h, kw


def epilogue_bench(args, tr) -> dict:
    steps, reqs, r2h, kw = epilogue_inputs(args, tr)
    cuda = args.device.startswith("cuda")
    timer = _timed_cuda if cuda else _timed_cpu
    miss_share = [float(m.sum()) / m.numel() for _, m, _, _ in steps[WARMUP_STEPS:]]
    ref_c = StoreCounters(1, args.batch, 656, args.device)
    ref_us = [timer(lambda st=st: plan_epilogue_torch(*st, reqs, reqs, r2h, ref_c, 0, **kw)) for st in steps]
    out = {"miss_share_median": sorted(miss_share)[len(miss_share) // 2] if miss_share else None,
           "torch_us": _stats_us(ref_us[WARMUP_STEPS:])}
    if not cuda:
        out["triton"] = {"skipped": "needs CUDA: on a CPU the kernel runs only under TRITON_INTERPRET=1, not a timing"}
        return out
    from sgl_ess.kernels.plan_epilogue_triton import plan_epilogue_triton

    red = torch.zeros((args.batch, args.slots + 1), dtype=torch.int32, device=args.device)
    c = StoreCounters(1, args.batch, 656, args.device)

    def run(st):
        return plan_epilogue_triton(*st, reqs, reqs, r2h, red, hits_row=c.hits[0], misses_row=c.misses[0],
                                    layer_counts=c.step_counts[0], **kw)

    eager = [timer(lambda st=st: run(st)) for st in steps]
    out["triton_eager_us"] = _stats_us(eager[WARMUP_STEPS:])
    # one graph over static inputs; each replay takes the next step's resolver output
    static = tuple(t.clone() for t in steps[0])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run(static)
    replay = []
    for i, st in enumerate(steps):
        for dst, src in zip(static, st):
            dst.copy_(src)
        replay.append(_timed_cuda(graph.replay))
        if i == WARMUP_STEPS:             # compare one replay with the torch reference, entry for entry
            want = plan_epilogue_torch(*st, reqs, reqs, r2h, StoreCounters(1, args.batch, 656, args.device), 0, **kw)
            out["graph_replay_equals_torch"] = all(torch.equal(a, b) for a, b in zip(want, captured))
    out["triton_graph_replay_us"] = _stats_us(replay[WARMUP_STEPS:])
    out["scratch_left_zero"] = int(red.abs().sum()) == 0
    return out


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_step_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--steps", type=int, default=12, help=f"steps ({WARMUP_STEPS} warm-up; default 12)")
    p.add_argument("--configs", action="store_true", help="also time the resolver's other block configurations")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    apply_threads(args)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device; run with --device cpu")
    tr = trace(torch.Generator().manual_seed(0), args.batch, args.k, args.context, args.steps, args.repeat)
    shape = {k: getattr(args, k) for k in ("batch", "k", "slots", "context", "repeat", "steps", "device")}
    res = {"shape": shape, "measured": cuda, "goal_resolver_us": 50}
    if not cuda:
        res["note"] = "CPU dry run: torch paths at tiny shapes, wall clock; not a measurement"
    res["resolver"] = {"torch_us": _stats_us(resolver_eager(args, tr, "torch"))}
    if cuda:
        res["resolver"]["triton_eager_us"] = _stats_us(resolver_eager(args, tr, "triton"))
        res["resolver"]["triton_graph_replay_us"] = _stats_us(resolver_graph(args, tr))
        if args.configs:
            res["resolver"]["triton_configs"] = [
                {"block_k": bk, "block_n": bn, "num_warps": w,
                 "us": _stats_us(resolver_eager(args, tr, "triton", block_k=bk, block_n=bn, num_warps=w))}
                for bk, bn, w in RESOLVER_CONFIGS]
    else:
        res["resolver"]["triton"] = {"skipped": "needs CUDA (the interpreter is not a timing)"}
    with open(args.out, "w") as fh:               # the resolver's numbers survive a cut epilogue
        json.dump(res, fh, indent=1)
    res["plan_epilogue"] = epilogue_bench(args, tr)
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    for part in ("resolver", "plan_epilogue"):
        for key, val in res[part].items():
            if isinstance(val, dict) and "median" in val:
                print(f"[step kernels] {part:13s} {key:24s} median {val['median']:9.1f} us  "
                      f"(p10 {val['p10']:.1f}, p90 {val['p90']:.1f}, n {val['n']})", flush=True)
    bad = res["plan_epilogue"].get("graph_replay_equals_torch") is False or \
        res["plan_epilogue"].get("scratch_left_zero") is False
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
