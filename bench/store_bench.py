"""Store benchmark: resolver cost and LRU warmup effect, side by side in one run.

  python -m bench store [--batch 64 --k 2048 --slots 6400 --context 32768 --steps 12]

Prints and writes bench/results/store.json:
  1. resolver time per layer per step: the vectorised torch resolver vs the plain Python
     OrderedDict oracle doing the same work, and their ratio (median and spread over steps);
  2. misses per request per layer on the first decode step and in steady state, with and
     without LRU warmup, on a synthetic locality trace (each step keeps `--repeat` of the
     previous step's top-k).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from bench.meta import write_result
from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign


def trace(g, batch, k, context, steps, repeat):
    """[steps, batch, k] top-k sets; each keeps `repeat` of the previous set (random positions)."""
    cur = torch.stack([torch.randperm(context, generator=g)[:k] for _ in range(batch)])
    out = [cur]
    n_new = k - int(repeat * k)
    for _ in range(steps - 1):
        cur = cur.clone()
        cols = torch.stack([torch.randperm(k, generator=g)[:n_new] for _ in range(batch)])
        cur.scatter_(1, cols, torch.randint(context, (batch, n_new), generator=g))
        out.append(cur)
    return torch.stack(out)


def time_resolver(args, g):
    tr = trace(g, args.batch, args.k, args.context, args.steps + 2, args.repeat)
    buf = DeviceHotBuffer(1, args.batch, args.slots, 4, args.device)
    rows = torch.arange(args.batch, device=args.device)
    lens = torch.full((args.batch,), args.context, device=args.device)
    vec_ms = []
    for s in range(tr.shape[0]):
        t0 = time.perf_counter()
        assign(buf, 0, rows, lens, tr[s].to(args.device))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        if s >= 2:  # two warm-up steps
            vec_ms.append((time.perf_counter() - t0) * 1e3)
    oracles = [LruOracle(args.slots) for _ in range(args.batch)]
    lists = tr.tolist()
    ora_ms = []
    for s in range(min(tr.shape[0], args.oracle_steps + 2)):
        t0 = time.perf_counter()
        for i in range(args.batch):
            oracles[i].access(lists[s][i])
        if s >= 2:
            ora_ms.append((time.perf_counter() - t0) * 1e3)
    return vec_ms, ora_ms


def warmup_misses(args, g, warm: bool):
    """Misses per request per layer: first decode step and mean of later steps."""
    w = args.warmup_window
    tr = trace(g, args.batch, args.k, args.context, w + args.miss_steps, args.repeat)
    buf = DeviceHotBuffer(1, args.batch, args.slots, 4, "cpu")
    rows = torch.arange(args.batch)
    lens = torch.full((args.batch,), args.context)
    if warm:  # the prefill's last W query positions' top-k (the trace before decode starts)
        for s in range(w):
            assign(buf, 0, rows, lens, tr[s])
    per_step = []
    for s in range(w, tr.shape[0]):
        a = assign(buf, 0, rows, lens, tr[s])
        per_step.append(float(a.miss.sum()) / args.batch)
    return per_step[0], statistics.mean(per_step[len(per_step) // 2:])


def _stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench store", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64, help="requests per step (default 64)")
    p.add_argument("--k", type=int, default=2048, help="top-k entries per request (default 2048)")
    p.add_argument("--slots", type=int, default=6400, help="hot-buffer slots N per request (default 6400)")
    p.add_argument("--context", type=int, default=32768, help="context tokens per request (default 32768)")
    p.add_argument("--repeat", type=float, default=0.85, help="fraction of top-k kept step to step")
    p.add_argument("--steps", type=int, default=12, help="timed resolver steps (default 12)")
    p.add_argument("--oracle-steps", type=int, default=4, help="timed oracle steps (slow; default 4)")
    p.add_argument("--warmup-window", type=int, default=32, help="W prefill positions (default 32)")
    p.add_argument("--miss-steps", type=int, default=20, help="decode steps for the miss figures")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    print(f"[store bench] batch {args.batch}, k {args.k}, N {args.slots}, context {args.context}, "
          f"device {args.device}, torch threads {torch.get_num_threads()}", flush=True)
    vec, ora = time_resolver(args, g)
    v, o = _stats(vec), _stats(ora)
    print(f"resolver per layer per step: vectorised {v['median']:.2f} ms (min {v['min']:.2f}, max {v['max']:.2f}) | "
          f"python oracle {o['median']:.1f} ms (min {o['min']:.1f}, max {o['max']:.1f}) | "
          f"oracle/vectorised = {o['median'] / v['median']:.1f}x", flush=True)
    cold = warmup_misses(args, torch.Generator().manual_seed(1), warm=False)
    hot = warmup_misses(args, torch.Generator().manual_seed(1), warm=True)
    print(f"misses per request per layer (k={args.k}, repeat {args.repeat}):")
    print(f"  {'':16}{'first step':>12}{'steady state':>14}")
    print(f"  {'no warmup':16}{cold[0]:12.1f}{cold[1]:14.1f}")
    print(f"  {'warmup W=' + str(args.warmup_window):16}{hot[0]:12.1f}{hot[1]:14.1f}")
    path = write_result("store", {
        "config": vars(args),
        "resolver_ms_per_layer_step": {"vectorised": v, "oracle": o, "ratio_oracle_over_vectorised": o["median"] / v["median"]},
        "misses_per_request_layer": {"no_warmup": {"first_step": cold[0], "steady": cold[1]},
                                     "warmup": {"first_step": hot[0], "steady": hot[1]}},
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
