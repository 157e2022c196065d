"""TP split fetch: each attention-TP rank reads 1/tp of a step's misses from host memory and the group
all-gathers them (--ess-tp-split-fetch, sgl_ess/prefetch/split_fetch.py), against every rank reading
every miss. Side by side in one run, in real processes (one per rank, torch.distributed).

  python -m bench tp_split [--tp 2 --batch 16 --k 512 --context 8192 --layers 4 --steps 6]
                           [--device cpu|cuda] [--out PATH]

Each rank runs the same decode trace (bench/prefetch_bench.traces: per-layer similarity to the previous
step, seeded alike on every rank, as TP ranks run the same batches) through two real stores, one with
the split and one without, alternating step by step (both see the same machine state). Per layer-step
it times plan + land + commit of the misses (the indexer and attention are not run: they are the same
in both) and counts the rows each rank read from the host pool and received from the group.

What it measures is this machine's trade: on CPU the "host link" is memory bandwidth shared by the
ranks and the all-gather is gloo over loopback TCP, so it says nothing about PCIe vs NVLink on a GPU
node (--device cuda with NCCL does: one process per GPU; not yet run). The row counts are exact
anywhere: with the split each rank reads 1/tp of the misses.
Results: bench/results/tp_split.json (command, commit, dirty flag, versions) and --out.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from bench.meta import write_result


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rank_main(rank: int, size: int, init: str, opts: dict, out_dir: str) -> None:
    import torch.distributed as dist

    from bench.prefetch_bench import make_store, traces
    from sgl_ess.prefetch.split_fetch import SplitFetch, torch_all_gather

    args = argparse.Namespace(**opts)
    if args.device.startswith("cuda"):
        torch.cuda.set_device(rank)
        args.device = f"cuda:{rank}"
    dist.init_process_group("nccl" if args.device.startswith("cuda") else "gloo", init_method=init, rank=rank,
                            world_size=size)
    torch.set_num_threads(args.threads)
    tr = traces(args, torch.Generator().manual_seed(1))          # the same on every rank
    engine = "stream" if args.device.startswith("cuda") else "inline"
    runs = {}
    for name in ("whole", "split"):
        store, table, _ = make_store(args, engine)
        if name == "split":
            store.engine = SplitFetch(store.engine, rank, size, torch_all_gather())
        reqs = table.indices(list(range(args.batch)))
        lens = table.seq_lens(list(range(args.batch)))
        runs[name] = {"store": store, "table": table, "reqs": reqs, "lens": lens, "ms": []}
    for step, layers in enumerate(tr):
        for name, r in runs.items():
            dist.barrier()
            for layer in range(args.layers):
                topk = layers[layer].to(args.device)
                _sync(args.device)
                t0 = time.perf_counter()
                st = r["store"].plan(layer, r["reqs"], r["lens"], topk, r["table"].req_to_host, validate=False)
                r["store"].land(st)
                r["store"].commit(st)
                _sync(args.device)
                if step:                                          # step 0 fills the hot buffers
                    r["ms"].append((time.perf_counter() - t0) * 1e3)
        if rank == 0:
            print(f"[tp_split] step {step + 1}/{len(tr)} done", flush=True)
    out = {}
    for name, r in runs.items():
        store = r["store"]
        stats = store.engine.stats()
        snap = store.counters.snapshot()
        out[name] = {"layer_step_ms_median": statistics.median(r["ms"]), "layer_steps": len(r["ms"]),
                     "host_rows_read": stats["tiers"]["immediate"]["rows"],
                     "misses": sum(snap["layer_misses"]), "split_fetch": stats.get("split_fetch")}
        store.shutdown()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench tp_split", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tp", type=int, default=2, help="ranks (processes) in the attention-TP group")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--k", type=int, default=512, help="top-k per request per layer")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6, help="decode steps after the first (which fills the buffers)")
    ap.add_argument("--slots", type=int, default=0, help="hot slots per request (0 = 2 x k)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.tp < 2:
        print("--tp: expected >= 2 (the split needs a group)", file=sys.stderr)
        return 2
    if args.device.startswith("cuda") and torch.cuda.device_count() < args.tp:
        print(f"--device cuda --tp {args.tp}: needs {args.tp} GPUs, found {torch.cuda.device_count()}",
              file=sys.stderr)
        return 2
    args.slots = args.slots or 2 * args.k
    opts = {**vars(args), "steps": args.steps + 1}
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_rank_main, args=(args.tp, f"file://{d}/rendezvous", opts, d), nprocs=args.tp, join=True)
        ranks = [torch.load(os.path.join(d, f"rank{r}.pt")) for r in range(args.tp)]
    whole = [r["whole"] for r in ranks]
    split = [r["split"] for r in ranks]
    ratio = [s["layer_step_ms_median"] / w["layer_step_ms_median"] for s, w in zip(split, whole)]
    summary = {
        "what": "plan + land + commit of a decode layer-step's misses per rank, split (each rank reads 1/tp from "
                "host and the group all-gathers) vs whole (each rank reads all); median ms per layer-step; "
                f"on {args.device}: " + ("memory bandwidth and gloo over loopback, not PCIe vs NVLink"
                                         if args.device == "cpu" else "PCIe reads and an NCCL all-gather"),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "ranks": ranks,
        "split_over_whole_time": ratio,
        "host_rows_read_per_rank": {"whole": [w["host_rows_read"] for w in whole],
                                    "split": [s["host_rows_read"] for s in split]},
        "same_misses": len({w["misses"] for w in whole} | {s["misses"] for s in split}) == 1,
    }
    path = write_result("tp_split", summary, also_to=args.out)
    for i, (w, s) in enumerate(zip(whole, split)):
        print(f"rank {i}: whole {w['layer_step_ms_median']:.3f} ms/layer-step, {w['host_rows_read']} host rows; "
              f"split {s['layer_step_ms_median']:.3f} ms, {s['host_rows_read']} host rows "
              f"(received {s['split_fetch']['rows_received']}); split/whole time {ratio[i]:.2f}")
    print(f"results: {path}")
    return 0 if summary["same_misses"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
