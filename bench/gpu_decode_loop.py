"""Step 5 of bench/gpu_check.sh: a standalone decode loop at the paper's shapes, without SGLang.

  python -m bench.gpu_decode_loop --out PATH [--device cuda] [--layers 61 --k 2048 --context 32768
                                  --slots 6400 --heads 128 --max-batch 64 --steps 3] [--trace FILE]

The loop of bench/prefetch_bench.py (its CUDA path: the real LatentStore with the side-stream
engine, the Triton resolver, plan epilogue, FlashTrans and sparse-MLA decode, a context-sized
indexer stand-in per layer) driven by a top-k TRACE instead of a fixed per-layer overlap, so the
hit rates are the trace's: by default sgl_ess/prefetch/synthetic_trace.py at k 2048 over the
context (calibrated to DeepSeek-V3.2's measured step-to-step overlap and miss peak; its reuse
process is an assumption, said in its note), or a recorded trace (--trace, sgl_ess.topk_trace/1,
same layers and k). The trace's `--trace-requests` requests are tiled over the batch (row i
replays trace request i mod n). Per layer: the newest token's row into its hot slot (`admit`),
the indexer, `plan` (one per DBA half), attention by overlap level
(sgl_ess/attention/overlap.decode_layer), commit.

Batch: up to the device budget (--device-budget-gb over N slots x 656 B x layers per request)
and --max-batch. Host rows: as many row sets of the whole context as --host-budget-gb holds (the
lent machine's 128 GiB and the time to page-lock them bound it, not the method); request i reads
set i mod S, with S coprime with the trace's request count, so requests sharing a set replay
different trace requests and never fetch the same host row in one step (batch <= lcm). Each
request has its own hot buffer, LRU state and fetches.

Measured, per overlap level none / da / dba (CUDA events at every layer boundary of the compute
stream, one host sync per step; median over --steps after one warm-up step, LRU re-warmed from
the trace's prefill sets before each configuration):
  layer_ms         per layer, with the fetch (stream engine)
  compute_ms       the same level with a null engine (no row moves): its own compute
  exposed_ms       layer_ms - compute_ms: the fetch left on the critical path
  steps_per_s      1000 / median step time; tokens_per_s = steps_per_s x batch
And at EQUAL DEVICE BYTES, the all-resident baseline: every row of every request in a device
pool, the same newest-row write, indexer and Triton attention kernel reading rows straight from
the pool, with as many requests as fit in the bytes ESS took (its slot space, rings, LRU state,
tables: torch.cuda.memory_allocated after its first step, minus before it was built). Both sides
share the indexer's key stand-in and the query, which are not counted.

Results go to --out after each configuration (a run cut by its timeout keeps what finished).
On a CPU (--device cpu, the dry run) the same loop runs at tiny shapes with the inline engine and
the torch attention reference: it checks the code path, measures nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import numpy as np
import torch

from bench.prefetch_bench import NullEngine
from sgl_ess.attention.overlap import decode_layer, split_halves
from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.store import LatentStore, StoreConfig

MODES = ("none", "da", "dba")
INDEX_DIM = 128                   # the lightning indexer's head dim


class Marks:
    """Timestamps at layer boundaries: CUDA events on the current stream (no sync until `ms`), or
    the host clock on a CPU."""

    def __init__(self, cuda: bool, n: int):
        self.cuda = cuda
        self.ev = [torch.cuda.Event(enable_timing=True) for _ in range(n)] if cuda else [0.0] * n

    def mark(self, i: int) -> None:
        if self.cuda:
            self.ev[i].record()
        else:
            self.ev[i] = time.perf_counter()

    def ms(self) -> list[float]:
        """Milliseconds between consecutive marks (syncs once on CUDA)."""
        if self.cuda:
            self.ev[-1].synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.ev, self.ev[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.ev, self.ev[1:])]


def load_trace(args):
    """(warm ids per layer [n, W, k], per step: (seq_lens [n], topk per layer [n, k]), note)."""
    if args.trace:
        from sgl_ess.prefetch.trace_format import read_trace

        tr = read_trace(args.trace)
        if tr.num_layers != args.layers or tr.topk != args.k:
            raise SystemExit(f"--trace {args.trace}: {tr.num_layers} layers, k {tr.topk}; this run has --layers "
                             f"{args.layers} --k {args.k}")
    else:
        from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate

        tr = generate(SyntheticTraceConfig(num_layers=args.layers, topk=args.k, context_tokens=args.context,
                                           steps=args.steps + 1, requests=args.trace_requests,
                                           hot_slots_per_request=args.slots, warmup_sets=args.warmup_sets))
    warm = {}
    steps: list[dict] = []
    for ev in tr.events:
        if ev["ev"] == "warmup" and ev["layer"] not in warm:
            warm[ev["layer"]] = (ev["seq_lens"], ev["ids"])
        elif ev["ev"] == "plan" and ev.get("mb", 0) == 0:
            if not steps or ev["layer"] in steps[-1]["topk"]:
                steps.append({"seq_lens": ev["seq_lens"], "topk": {}})
            steps[-1]["topk"][ev["layer"]] = ev["topk"]
    steps = [s for s in steps if len(s["topk"]) == args.layers][:args.steps + 1]
    if len(warm) != args.layers or len(steps) < args.steps + 1:
        raise SystemExit(f"trace: warm-up sets for {len(warm)} of {args.layers} layers and {len(steps)} full "
                         f"decode steps; this run needs all layers and {args.steps + 1} steps")
    return warm, steps, tr.header.get("note", "")


def tile(a: np.ndarray, b: int, device) -> torch.Tensor:
    """Trace rows tiled over a batch of b: row i is trace row i mod n."""
    return torch.as_tensor(a[np.arange(b) % a.shape[0]]).to(device)


class Workload:
    """The inputs both sides share: per step the top-k of every layer (tiled to the ESS batch),
    the query, the indexer stand-in and the newest rows."""

    def __init__(self, args, warm, steps, batch: int):
        dev = args.device
        g = torch.Generator().manual_seed(0)
        self.lay = LatentLayout("fp8_flashmla", 512, 64)
        self.batch = batch
        self.warm = {layer: (tile(s, batch, dev), tile(ids, batch, dev)) for layer, (s, ids) in warm.items()}
        self.seq = [tile(s["seq_lens"], batch, dev) for s in steps]
        self.topk = [[tile(s["topk"][layer], batch, dev) for layer in range(args.layers)] for s in steps]
        dt = torch.bfloat16 if dev.startswith("cuda") else torch.float32
        self.q = (torch.randn(batch, args.heads, self.lay.dim, generator=g) * 0.5).to(dev, dt)
        self.index_q = torch.randn(batch, args.index_heads, INDEX_DIM, generator=g).to(dev, dt)
        self.index_keys = torch.randn(args.context, INDEX_DIM, generator=g).to(dev, dt)
        self.newest = self.lay.encode(torch.randn(batch, self.lay.dim, generator=g)).to(dev)
        self.scale = self.lay.dim ** -0.5

    def indexer(self, part: slice) -> torch.Tensor:
        """Context-sized scoring and a top-k: the lightning indexer's cost, standing in for it."""
        return torch.einsum("bhd,sd->bhs", self.index_q[part], self.index_keys).relu().sum(1).topk(8, dim=1).indices

    def attend(self, cuda: bool):
        if cuda:
            from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton

            return lambda q, rows, slots: sparse_mla_decode_triton(q, rows, slots, self.lay, self.scale)
        from sgl_ess.attention.reference import sparse_mla_decode

        return lambda q, rows, slots: sparse_mla_decode(q, rows, slots, self.lay, self.scale)


def _alloc_bytes(cuda: bool) -> int:
    if cuda:
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()
    return 0


def host_row_sets(batch: int, fit_host: int, trace_requests: int) -> int:
    """Distinct host row sets: as many as the host budget holds (at most one per request), coprime
    with the trace's request count, so requests that share host rows replay different trace
    requests (no two of the first lcm(sets, trace requests) fetch the same row in one step)."""
    sets = max(1, min(batch, fit_host))
    while sets > 1 and math.gcd(sets, trace_requests) != 1 and sets < batch:
        sets -= 1
    return sets


def build_store(args, batch: int, sets: int):
    """The store with `batch` request rows and `sets` x max_context host rows per layer; request i
    reads host row set i mod sets (req_to_host int64 [batch, max_context] on the store's device)."""
    cuda = args.device.startswith("cuda")
    max_ctx = args.context + args.steps + 2
    cfg = StoreConfig(num_layers=args.layers, row_bytes=656, host_capacity_tokens=sets * max_ctx,
                      hot_slots_per_request=args.slots, max_requests=batch, topk=args.k, max_context_tokens=max_ctx,
                      device=args.device, resolver_backend="auto" if cuda else "torch")
    store = LatentStore(cfg, engine="stream" if cuda else "inline")
    pos = torch.arange(max_ctx, device=store.device)
    req_to_host = torch.stack([(i % sets) * max_ctx + pos for i in range(batch)])
    for i in range(batch):
        store.open(i)
    fill_rows(store.host.rows)
    return store, req_to_host


def fill_rows(rows: torch.Tensor, block_rows: int = 1 << 14) -> None:
    """Valid FP8 latent rows (the layout's own encoding of random latents: random bytes would hold
    NaN codes and scales, and zeros can time faster than data) in every row of `rows` (uint8
    [..., 656], host or device), a random block repeated: seconds for tens of GB."""
    lay = LatentLayout("fp8_flashmla", 512, 64)
    g = torch.Generator().manual_seed(1)
    flat = rows.view(-1, rows.shape[-1])
    block = lay.encode(torch.randn(min(block_rows, flat.shape[0]), lay.dim, generator=g)).to(rows.device)
    for start in range(0, flat.shape[0], block.shape[0]):
        n = min(block.shape[0], flat.shape[0] - start)
        flat[start:start + n].copy_(block[:n])


def ess_config(args, store, req_to_host, wl: Workload, mode: str, engine: str) -> dict:
    """One overlap level with the real engine or the null one; LRU re-warmed from the trace first."""
    cuda = args.device.startswith("cuda")
    real = store.engine
    b = wl.batch
    reqs = torch.arange(b, device=args.device)
    for r in range(b):
        store.close(r)
        store.open(r)
    fill_rows(store.slot_rows)     # rows a null engine leaves unfetched (rings) hold data, not zeros
    for layer, (seq, ids) in wl.warm.items():
        store.warmup(layer, reqs, seq, ids, req_to_host)       # the real engine: the same rows resident
    real.drain()
    if engine == "null":
        store.engine = NullEngine(real)
    try:
        attend = wl.attend(cuda)
        parts = split_halves(b) if mode == "dba" else [slice(0, b)]
        layer_ms, step_ms, misses = [], [], None
        for s, (lens, topk) in enumerate(zip(wl.seq, wl.topk)):
            if s == 1:
                misses0 = store.counters.snapshot()["layer_misses"]
            marks = Marks(cuda, args.layers + 1)
            for layer in range(args.layers):
                marks.mark(layer)
                store.admit(layer, reqs, lens - 1, wl.newest, validate=False)
                plans = []
                for i, part in enumerate(parts):
                    wl.indexer(part)
                    plans.append(store.plan(layer, reqs[part], lens[part], topk[layer][part], req_to_host,
                                            micro_batch=i, validate=False))
                decode_layer(store, mode, wl.q, plans, attend)
            marks.mark(args.layers)
            ms = marks.ms()
            store.engine.drain()
            if s:
                layer_ms.append(ms)
                step_ms.append(sum(ms))
        if engine != "null":
            after = store.counters.snapshot()["layer_misses"]
            misses = [(a - m) / (b * args.steps) for a, m in zip(after, misses0)]
    finally:
        store.engine = real
    return {"mode": mode, "engine": engine, "layer_ms": [statistics.median(c) for c in zip(*layer_ms)],
            "step_ms": {"median": statistics.median(step_ms), "min": min(step_ms), "max": max(step_ms)},
            "misses_per_request_per_layer": misses}


def resident(args, wl: Workload, batch: int) -> dict:
    """All rows on the device: the same step with the attention reading the pool directly."""
    cuda = args.device.startswith("cuda")
    max_ctx = args.context + args.steps + 2
    per_layer = batch * max_ctx
    pool = torch.empty((args.layers * per_layer, 656), dtype=torch.uint8, device=args.device)
    fill_rows(pool)
    attend = wl.attend(cuda)
    base = torch.arange(batch, device=args.device).unsqueeze(1) * max_ctx
    q, part = wl.q[:batch], slice(0, batch)
    step_ms = []
    for s, (lens, topk) in enumerate(zip(wl.seq, wl.topk)):
        marks = Marks(cuda, args.layers + 1)
        for layer in range(args.layers):
            marks.mark(layer)
            off = layer * per_layer
            pool.index_copy_(0, off + base[:, 0] + lens[:batch] - 1, wl.newest[:batch])
            wl.indexer(part)
            tk = topk[layer][:batch]
            slots = torch.where(tk >= 0, off + base + tk, -1).to(torch.int32)
            attend(q, pool, slots)
        marks.mark(args.layers)
        ms = marks.ms()
        if s:
            step_ms.append(sum(ms))
    del pool
    return {"batch": batch, "device_pool_bytes": args.layers * per_layer * 656,
            "step_ms": {"median": statistics.median(step_ms), "min": min(step_ms), "max": max(step_ms)}}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_decode_loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--context", type=int, default=32768, help="prompt tokens per request (default 32768)")
    p.add_argument("--slots", type=int, default=6400, help="hot slots N per request per layer (default 6400)")
    p.add_argument("--heads", type=int, default=128, help="query heads (DeepSeek-V3.2: 128)")
    p.add_argument("--index-heads", type=int, default=64, help="indexer heads (DeepSeek-V3.2: 64)")
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--device-budget-gb", type=float, default=40.0, help="device bytes for latent rows (1e9 B)")
    p.add_argument("--host-budget-gb", type=float, default=12.0,
                   help="host bytes for latent rows (1e9 B); fewer host row sets than requests are shared")
    p.add_argument("--steps", type=int, default=3, help="timed decode steps per configuration (+1 warm-up)")
    p.add_argument("--trace", metavar="FILE", help="a recorded sgl_ess.topk_trace/1 file (default: synthetic)")
    p.add_argument("--trace-requests", type=int, default=8, help="synthetic trace requests tiled over the batch")
    p.add_argument("--warmup-sets", type=int, default=8, help="synthetic trace: prefill top-k sets per layer")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device; run with --device cpu")
    row_bytes, max_ctx = 656, args.context + args.steps + 2
    fit_dev = int(args.device_budget_gb * 1e9 // (args.layers * args.slots * row_bytes))
    fit_host = int(args.host_budget_gb * 1e9 // (args.layers * max_ctx * row_bytes))
    batch = min(args.max_batch, fit_dev)
    sets = host_row_sets(batch, fit_host, args.trace_requests)
    res = {"args": vars(args), "measured": cuda,
           "batch": {"ess": batch, "max_batch": args.max_batch, "device_budget_fit": fit_dev, "host_budget_fit": fit_host,
                     "host_row_sets": sets}}
    if not cuda:
        res["note"] = "CPU dry run: tiny shapes, inline engine, torch attention reference; not a measurement"

    def save():
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)

    if batch < 2:
        res["error"] = f"batch {batch} < 2 (DBA needs two halves): raise --device-budget-gb or --max-batch"
        save()
        return 1
    t0 = time.perf_counter()
    warm, steps, note = load_trace(args)
    res["trace"] = {"source": args.trace or "synthetic", "note": note, "seconds": round(time.perf_counter() - t0, 1)}
    save()
    wl = Workload(args, warm, steps, batch)
    before = _alloc_bytes(cuda)
    t0 = time.perf_counter()
    store, req_to_host = build_store(args, batch, sets)
    res["store_build_s"] = round(time.perf_counter() - t0, 1)      # host pool: populate, register, fill
    save()
    print(f"[decode loop] batch {batch}, {args.layers} layers, k {args.k}, N {args.slots}, context {args.context}; "
          f"store built in {res['store_build_s']} s", flush=True)
    res["ess"] = []
    try:
        for mode in MODES:
            for engine in ("null", "real"):
                r = ess_config(args, store, req_to_host, wl, mode, engine)
                if "device_bytes" not in res["batch"]:     # after the first step: lazy scratch included
                    res["batch"]["device_bytes"] = (_alloc_bytes(cuda) - before) if cuda else \
                        int(store.slot_rows.numel() * store.slot_rows.element_size())
                    res["batch"]["device_bytes_source"] = ("torch.cuda.memory_allocated() after the first step "
                                                           "minus before the store" if cuda else
                                                           "CPU: the slot space's bytes only")
                res["ess"].append(r)
                save()
                print(f"[decode loop] {mode:>4}+{engine:<4} step {r['step_ms']['median']:8.2f} ms", flush=True)
    finally:
        store.shutdown()
    by = {(r["mode"], r["engine"]): r for r in res["ess"]}
    res["overlap"] = {}
    for mode in MODES:
        real, null = by[(mode, "real")], by[(mode, "null")]
        exposed = [max(0.0, a - c) for a, c in zip(real["layer_ms"], null["layer_ms"])]
        sps = 1e3 / real["step_ms"]["median"]
        res["overlap"][mode] = {"step_ms": real["step_ms"]["median"], "compute_ms": sum(null["layer_ms"]),
                                "exposed_ms": sum(exposed), "exposed_ms_per_layer": exposed,
                                "steps_per_s": sps, "tokens_per_s": sps * batch}
        print(f"[decode loop] ESS {mode:>4}: {real['step_ms']['median']:8.2f} ms/step, compute "
              f"{sum(null['layer_ms']):8.2f} ms, exposed fetch {sum(exposed):7.2f} ms, {sps * batch:9.1f} tokens/s",
              flush=True)
    res["hit_rate_per_layer"] = [1.0 - m / args.k for m in by[("none", "real")]["misses_per_request_per_layer"]]
    del store, req_to_host
    res_batch = int(res["batch"]["device_bytes"] // (args.layers * max_ctx * row_bytes))
    if res_batch < 1:
        res["resident"] = {"skipped": f"fewer than one request's {max_ctx} rows x {args.layers} layers fits in the "
                                      f"{res['batch']['device_bytes']} bytes ESS took"}
    else:
        r = resident(args, wl, min(res_batch, batch))
        sps = 1e3 / r["step_ms"]["median"]
        r.update(steps_per_s=sps, tokens_per_s=sps * r["batch"])
        res["resident"] = r
        best = max(MODES, key=lambda m: res["overlap"][m]["tokens_per_s"])
        res["equal_device_bytes"] = {"ess_level": best, "ess_batch": batch, "resident_batch": r["batch"],
                                     "ess_tokens_per_s": res["overlap"][best]["tokens_per_s"],
                                     "resident_tokens_per_s": r["tokens_per_s"],
                                     "ess_over_resident": res["overlap"][best]["tokens_per_s"] / r["tokens_per_s"]}
        print(f"[decode loop] resident batch {r['batch']}: {r['step_ms']['median']:8.2f} ms/step, "
              f"{r['tokens_per_s']:9.1f} tokens/s; ESS ({best}, batch {batch}) / resident = "
              f"{res['equal_device_bytes']['ess_over_resident']:.2f}", flush=True)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
