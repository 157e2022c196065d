"""Prefetch benchmark: how much of the miss fetch each overlap level leaves on the critical path.

  python -m bench prefetch [--batch 32 --k 2048 --context 32768 --layers 8 --steps 4]
                           [--device cpu] [--write-profile FILE] [--out PATH]

A decode-layer loop over the real store (LatentStore: host pool, slot space, exact LRU, staging
ring, fetch engine). Per layer and step, on the critical path:
  indexer   a context-proportional scoring GEMM (--index-heads x 128 dims over the whole context)
            and a top-k, standing in for DSA's lightning indexer (its cost grows with context)
  fetch     the layer's misses host -> ring (engine `inline`: in this thread; `worker`: the
            prefetch worker process, over ZMQ, into shared memory)
  attention absorbed sparse MLA over k rows (--heads x 576) from the slot space, torch reference
Top-k traces keep a per-layer fraction of the previous step's set (the intra-layer similarity
shape of ESS.md §3: high in early and late layers, lower in the middle, none in layer 0), so the
miss rate differs per layer; the run states the misses per request per layer it saw.

Per configuration it reports, per layer (median over steps after one warm-up step):
  compute_ms   the layer's wall time minus its exposed fetch time (indexer + attention + planning)
  fetch_ms     time the engine spent moving the rows (its own busy time)
  exposed_ms   time the critical path spent on the fetch: submitting it and waiting for it
and their ratio exposed / fetch. Configurations (CPU): none+inline, none+worker, da+inline,
da+worker, dba+inline, dba+worker. `--write-profile` writes the per-layer fastest of none / da
/ dba (worker engine on CPU, stream engine on CUDA) as an overlap profile for
`prefetch_overlap_level: full`.

With --device cuda (the GPU counterpart, run by bench/gpu_check.sh at the paper's shapes:
--layers 61 --batch 64 --heads 64) everything runs asynchronously on the device, so the layer
time comes from CUDA events, attention is the Triton sparse-MLA kernel, the engine is the
side-stream engine (busy time from timing events around its copies), and
  compute_ms   the same layer with the fetch removed (a null engine: rows are not moved)
  exposed_ms   layer time with the fetch minus compute_ms
Configurations: none+stream, da+stream, dba+stream, none+inline.
Results: bench/results/prefetch.json (command, commit, dirty flag, versions) and --out.

With --predictors NAME,... the suite instead scores the speculative tier's predictors on top-k
traces (bench/predictor_bench.py; results: bench/results/prefetch_predictors.json).
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

import torch

from bench.meta import write_result
from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.overlap import OverlapProfile, decode_layer, split_halves
from sgl_ess.attention.reference import sparse_mla_decode
from sgl_ess.store import LatentStore, RequestTable, StoreConfig

CONFIGS = [("none", "inline"), ("none", "worker"), ("da", "inline"), ("da", "worker"),
           ("dba", "inline"), ("dba", "worker")]


def similarity(layer: int, layers: int) -> float:
    """ESS.md §3: ~0 in layer 0, 0.7-0.9 in the first and last quarter, 0.3-0.6 in the middle."""
    if layer == 0:
        return 0.0
    x = layer / max(1, layers - 1)
    return 0.85 if (x < 0.28 or x > 0.78) else 0.5


class Timer:
    def __init__(self):
        self.s = 0.0

    def run(self, fn, *a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            self.s += time.perf_counter() - t0


def make_store(args, engine: str):
    lay = LatentLayout("fp8_flashmla", 512, 64)
    cfg = StoreConfig(num_layers=args.layers, row_bytes=lay.row_bytes,
                      host_capacity_tokens=args.batch * (args.context + args.steps + 2),
                      hot_slots_per_request=args.slots, max_requests=args.batch, topk=args.k,
                      max_context_tokens=args.context + args.steps + 2, device=args.device)
    store = LatentStore(cfg, engine=engine)
    table = RequestTable(store)
    g = torch.Generator().manual_seed(0)
    for i in range(args.batch):
        table.add(i, args.context)
    # distinct bytes per host row (content does not matter for timing, only that it moves); a
    # multi-GB pool (the GPU run) stays zero rather than spending minutes on random bytes
    if store.host.rows.numel() <= 2 ** 31:
        store.host.rows.copy_(torch.randint(0, 255, store.host.rows.shape, generator=g, dtype=torch.uint8))
    return store, table, lay


def traces(args, g):
    """[steps+1][layer] -> top-k int64 [b, k] over the context, per-layer similarity."""
    out = []
    prev = [torch.stack([torch.randperm(args.context, generator=g)[:args.k] for _ in range(args.batch)])
            for _ in range(args.layers)]
    for _ in range(args.steps + 1):
        cur = []
        for layer in range(args.layers):
            keep = int(similarity(layer, args.layers) * args.k)
            t = prev[layer].clone()
            n_new = args.k - keep
            if n_new:
                cols = torch.stack([torch.randperm(args.k, generator=g)[:n_new] for _ in range(args.batch)])
                t.scatter_(1, cols, torch.randint(args.context, (args.batch, n_new), generator=g))
            cur.append(t)
        out.append(cur)
        prev = cur
    return out


class NullEngine:
    """Moves nothing: the same layer's compute with the fetch removed (CUDA reference)."""

    name = "null"
    ordered_on_device = True

    def __init__(self, inner):
        self.inner = inner

    def submit(self, plan):
        from sgl_ess.prefetch.engine import Ticket

        return Ticket(-1, plan.tier)

    def wait(self, ticket):
        return None

    def drain(self):
        return None

    def close(self):
        self.inner.close()

    def stats(self):
        return {"engine": "null", "tiers": {"immediate": {"busy_s": 0.0}}}


def run_config_cuda(args, mode: str, engine: str, tr, index_keys, q) -> dict:
    """Event-timed layer loop on the GPU (see the module docstring)."""
    from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
    from sgl_ess.prefetch.stream_engine import StreamEngine

    store, table, lay = make_store(args, "inline" if engine in ("inline", "null") else "stream")
    if engine == "stream":
        store.engine.close()
        store.engine = StreamEngine(store.memory, store.transfer_backend, timing=True)
    elif engine == "null":
        store.engine = NullEngine(store.engine)
    reqs = table.indices(list(range(args.batch)))
    lens = table.seq_lens(list(range(args.batch)))
    index_q = torch.randn(args.batch, args.index_heads, 128, device=args.device)
    keys = index_keys.to(args.device)
    qd = q.to(args.device, torch.bfloat16)
    layer_ms = [[] for _ in range(args.layers)]

    def attend(qq, rows, slots):
        return sparse_mla_decode_triton(qq, rows, slots, lay, 0.04)

    for step, layers in enumerate(tr):
        for layer in range(args.layers):
            topk = layers[layer].to(args.device)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            parts = split_halves(args.batch) if mode == "dba" else [slice(0, args.batch)]
            steps = []
            for i, part in enumerate(parts):
                torch.einsum("bhd,sd->bhs", index_q[part], keys).relu().sum(1).topk(8, dim=1)
                steps.append(store.plan(layer, reqs[part], lens[part], topk[part], table.req_to_host,
                                        micro_batch=i, validate=False))
            decode_layer(store, mode, qd, steps, attend)
            b.record()
            b.synchronize()
            if step:
                layer_ms[layer].append(a.elapsed_time(b))
    stats = store.engine.stats()
    store.shutdown()
    del store, table
    gc.collect()
    med = [statistics.median(v) for v in layer_ms]
    busy = stats["tiers"]["immediate"].get("busy_s") or 0.0
    return {"mode": mode, "engine": engine, "per_layer_median": {"layer_ms": med},
            "total_ms": {"layer": sum(med), "fetch": busy * 1e3 / max(1, args.steps)}, "engine_stats": stats}


def run_config(args, mode: str, engine: str, tr, index_keys, q) -> dict:
    if args.device.startswith("cuda"):
        return run_config_cuda(args, mode, engine, tr, index_keys, q)
    store, table, lay = make_store(args, engine)
    reqs = table.indices(list(range(args.batch)))
    lens = table.seq_lens(list(range(args.batch)))
    per_layer = {"compute_ms": [[] for _ in range(args.layers)], "fetch_ms": [[] for _ in range(args.layers)],
                 "exposed_ms": [[] for _ in range(args.layers)], "misses": [[] for _ in range(args.layers)]}

    def attend(qq, rows, slots):
        return sparse_mla_decode(qq, rows, slots, lay, 0.04)

    def indexer(part: slice):
        # context-proportional scoring (the lightning indexer's shape at --index-heads) + top-k
        s = torch.einsum("bhd,sd->bhs", index_q[part], index_keys).relu().sum(1)
        return s.topk(8, dim=1).indices

    index_q = torch.randn(args.batch, args.index_heads, 128)
    for step, layers in enumerate(tr):
        for layer in range(args.layers):
            topk = layers[layer]
            t_sub, t_wait = Timer(), Timer()
            busy0 = _engine_busy(store)
            misses0 = sum(store.counters.snapshot()["layer_misses"])
            orig_submit, orig_land = store.engine.submit, store.land

            def submit(plan, _f=orig_submit):
                return t_sub.run(_f, plan) if plan.tier == "immediate" else _f(plan)

            store.engine.submit = submit
            store.land = lambda s, _f=orig_land: t_wait.run(_f, s)
            t0 = time.perf_counter()
            parts = split_halves(args.batch) if mode == "dba" else [slice(0, args.batch)]
            steps = []
            for i, part in enumerate(parts):
                indexer(part)
                steps.append(store.plan(layer, reqs[part], lens[part], topk[part], table.req_to_host,
                                        micro_batch=i, validate=False))
            decode_layer(store, mode, q, steps, attend)
            store.engine.drain()
            wall = time.perf_counter() - t0
            store.engine.submit, store.land = orig_submit, orig_land
            if step == 0:
                continue   # warm-up (cold LRU)
            fetch = _engine_busy(store) - busy0
            exposed = t_sub.s + t_wait.s
            per_layer["fetch_ms"][layer].append(fetch * 1e3)
            per_layer["exposed_ms"][layer].append(exposed * 1e3)
            per_layer["compute_ms"][layer].append((wall - exposed) * 1e3)
            per_layer["misses"][layer].append((sum(store.counters.snapshot()["layer_misses"]) - misses0) / args.batch)
    stats = store.engine.stats()
    store.shutdown()
    del store, table
    gc.collect()                 # give the GBs of host pool and slot space back before the next config
    med = {k: [statistics.median(v) for v in vals] for k, vals in per_layer.items()}
    fetch, exposed = sum(med["fetch_ms"]), sum(med["exposed_ms"])
    return {"mode": mode, "engine": engine, "per_layer_median": med,
            "total_ms": {"compute": sum(med["compute_ms"]), "fetch": fetch, "exposed": exposed},
            "exposed_over_fetch": exposed / fetch if fetch else None, "engine_stats": stats}


def _engine_busy(store) -> float:
    t = store.engine.stats()["tiers"]["immediate"]
    return t["busy_s"]


def main() -> int:
    if any(a == "--predictors" or a.startswith("--predictors=") for a in sys.argv[1:]):
        from bench.predictor_bench import main as predictors_main     # the speculative tier's predictors

        return predictors_main(sys.argv[1:])
    p = argparse.ArgumentParser(prog="python -m bench prefetch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--slots", type=int, default=6400, help="hot slots per request per layer (N)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--heads", type=int, default=16, help="attention heads of the decode query")
    p.add_argument("--index-heads", type=int, default=4, help="indexer heads (its cost grows with context)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--configs", default=",".join(f"{m}+{e}" for m, e in CONFIGS),
                   help="comma list of MODE+ENGINE (modes none/da/dba, engines inline/worker)")
    p.add_argument("--write-profile", metavar="FILE", help="write the per-layer fastest mode as an overlap profile")
    p.add_argument("--out", metavar="PATH", help="also write the result JSON here")
    args = p.parse_args()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("bench prefetch --device cuda: this machine has no CUDA device; nothing measured", file=sys.stderr)
            return 2
        if args.configs == p.get_default("configs"):
            args.configs = "none+null,none+stream,da+stream,dba+stream,none+inline"
    configs = [tuple(c.split("+")) for c in args.configs.split(",")]
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    tr = traces(args, g)
    index_keys = torch.randn(args.context, 128)
    q = torch.randn(args.batch, args.heads, 576)
    print(f"[prefetch] batch {args.batch}, k {args.k}, context {args.context}, N {args.slots}, "
          f"{args.layers} layers x {args.steps} steps (+1 warm-up), torch threads {torch.get_num_threads()}")
    results = []
    for mode, engine in configs:
        r = run_config(args, mode, engine, tr, index_keys, q)
        results.append(r)
        t = r["total_ms"]
        if "compute" in t:
            print(f"[prefetch] {mode:>4}+{engine:<6} compute {t['compute']:8.1f} ms  fetch {t['fetch']:7.2f} ms  "
                  f"exposed {t['exposed']:7.2f} ms  exposed/fetch {r['exposed_over_fetch'] or 0:.2f}")
    if args.device.startswith("cuda"):
        base = next((r for r in results if r["engine"] == "null"), None)
        for r in results:
            if base is None or r is base:
                continue
            comp = base["per_layer_median"]["layer_ms"]
            r["per_layer_median"]["compute_ms"] = comp
            r["per_layer_median"]["exposed_ms"] = [max(0.0, x - c) for x, c in zip(r["per_layer_median"]["layer_ms"], comp)]
            r["total_ms"].update(compute=sum(comp), exposed=sum(r["per_layer_median"]["exposed_ms"]))
            f = r["total_ms"]["fetch"]
            r["exposed_over_fetch"] = r["total_ms"]["exposed"] / f if f else None
            print(f"[prefetch] {r['mode']:>4}+{r['engine']:<6} layer {r['total_ms']['layer']:8.2f} ms  compute "
                  f"{sum(comp):8.2f} ms  fetch {f:7.2f} ms  exposed {r['total_ms']['exposed']:7.2f} ms")
        results = [r for r in results if r is not base] if base else results
        misses = None
    else:
        misses = results[0]["per_layer_median"]["misses"]
        print("[prefetch] misses per request per layer (median): " + ", ".join(f"{m:.0f}" for m in misses))
    payload = {"args": vars(args), "misses_per_request_per_layer": misses, "results": results}
    if args.write_profile:
        modes = []
        for layer in range(args.layers):
            best = min((r for r in results if r["engine"] in ("worker", "stream")),
                       key=lambda r: r["per_layer_median"]["compute_ms"][layer] + r["per_layer_median"]["exposed_ms"][layer])
            modes.append(best["mode"])
        prof = OverlapProfile(modes, {"command": "python -m bench prefetch", "args": vars(args)})
        with open(args.write_profile, "w") as fh:
            fh.write(prof.to_json() + "\n")
        payload["profile"] = modes
        print(f"[prefetch] wrote profile {args.write_profile}: {modes}")
    path = write_result("prefetch", payload, also_to=args.out)
    print(f"[prefetch] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
