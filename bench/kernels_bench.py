"""Kernel benchmark: the exact-LRU resolver (Triton kernel vs torch path) and the Triton sparse
MLA decode vs the torch reference.

  python -m bench kernels [--device cuda] [--out PATH] [--batch 64 --k 2048 --slots 6400 ...]

Writes bench/results/kernels_<device>.json (and PATH when given):
  1. resolver microseconds per layer per step at batch 64, k 2048, N 6400, context 32K, 85%
     step-to-step top-k overlap (goal on CUDA: <= 50 us): median / min / max / p10 / p90 over
     steps. CUDA: CUDA events around each call; the Triton kernel eagerly (wrapper + launch),
     replayed from a CUDA graph (what a captured decode step pays), and a few block-size
     configurations; the torch path eagerly. CPU: the torch path only (wall clock).
  2. sparse MLA decode, FP8 656-byte rows, 128 heads, k 2048: the Triton kernel vs the torch
     reference (max |error| of out and lse, microseconds). CPU: the reference's time only.
On CPU the Triton kernels run only under TRITON_INTERPRET=1, which is not a timing, so no
kernel times are reported there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.meta import write_result
from bench.workload_args import add_workload_args, apply_threads
from bench.store_bench import trace
from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.reference import sparse_mla_decode
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign

RESOLVER_CONFIGS = [  # (block_k, block_n, num_warps); the first is resolve_triton's default
    (1024, 2048, 8), (1024, 4096, 16), (512, 1024, 4), (2048, 2048, 16)]
DECODE_CONFIGS = [(16, 16, 8), (16, 16, 4), (16, 32, 8), (32, 16, 8)]   # (block_h, block_kv, num_warps); first = default


def _stats_us(xs):
    xs = sorted(xs)
    q = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"median": statistics.median(xs), "min": xs[0], "max": xs[-1], "p10": q(0.1),
            "p90": q(0.9), "n": len(xs)}


def _timed_cuda(fn):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _timed_cpu(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def _buffers(args):
    buf = DeviceHotBuffer(1, args.batch, args.slots, args.device, max_context_tokens=args.context)
    reqs = torch.arange(args.batch, device=args.device)
    lens = torch.full((args.batch,), args.context, device=args.device)
    return buf, reqs, lens


def resolver_eager(args, tr, backend, **kernel_cfg):
    """Per-step microseconds of one assign() call (the first 2 steps are warm-up)."""
    buf, reqs, lens = _buffers(args)
    timer = _timed_cuda if args.device.startswith("cuda") else _timed_cpu
    if kernel_cfg:
        from sgl_ess.kernels.resolver_triton import resolve_triton
        call = lambda t: resolve_triton(buf.slot_to_token_ext[0], buf.lru_order_ext[0],  # noqa: E731
                                        buf.token_map, reqs, lens, t, None, **kernel_cfg)
    else:
        call = lambda t: assign(buf, 0, reqs, lens, t, backend=backend)  # noqa: E731
    us = []
    for s in range(tr.shape[0]):
        t = tr[s].to(args.device)
        dt = timer(lambda: call(t))
        if s >= 2:
            us.append(dt)
    return us


def resolver_graph(args, tr):
    """Per-step microseconds of replaying a CUDA graph that captured one kernel resolve."""
    buf, reqs, lens = _buffers(args)
    tokens = tr[0].to(args.device).clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                     # compile and warm up outside the capture
        scratch, _, _ = _buffers(args)
        assign(scratch, 0, reqs, lens, tokens, backend="triton")
    torch.cuda.current_stream().wait_stream(side)
    del scratch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        assign(buf, 0, reqs, lens, tokens, backend="triton")
    us = []
    for s in range(tr.shape[0]):
        tokens.copy_(tr[s].to(args.device))
        dt = _timed_cuda(graph.replay)
        if s >= 2:
            us.append(dt)
    return us


def decode_case(args):
    g = torch.Generator().manual_seed(3)
    lay = LatentLayout("fp8_flashmla", 512, 64)
    n_rows = args.decode_rows
    rows = lay.encode(torch.randn(n_rows, lay.dim, generator=g).to(args.device))
    q = torch.randn(args.decode_tokens, args.heads, lay.dim, generator=g).to(torch.bfloat16).to(args.device)
    slots = torch.randint(0, n_rows, (args.decode_tokens, args.k), generator=g, dtype=torch.int32)
    slots[torch.rand(slots.shape, generator=g) < 0.02] = -1
    return lay, q, rows, slots.to(args.device), lay.dim ** -0.5


def decode_bench(args):
    lay, q, rows, slots, sm = decode_case(args)
    cuda = args.device.startswith("cuda")
    timer = _timed_cuda if cuda else _timed_cpu
    ref = lambda: sparse_mla_decode(q, rows, slots, lay, sm)  # noqa: E731
    want_o, want_l = ref()
    ref_us = [timer(ref) for _ in range(args.decode_reps)]
    out = {"shape": {"tokens": args.decode_tokens, "heads": args.heads, "k": args.k,
                     "dim": lay.dim, "row_bytes": lay.row_bytes, "rows": args.decode_rows},
           "reference_us": _stats_us(ref_us), "max_abs_out": float(want_o.abs().max())}
    if not cuda:
        out["triton"] = "not timed: on CPU the kernel runs only under TRITON_INTERPRET=1"
        return out
    from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
    out["triton"] = []
    for bh, bkv, warps in DECODE_CONFIGS:
        run = lambda: sparse_mla_decode_triton(q, rows, slots, lay, sm, block_h=bh,  # noqa: E731
                                               block_kv=bkv, num_warps=warps)
        got_o, got_l = run()
        fin = torch.isfinite(want_l)
        us = [timer(run) for _ in range(args.decode_reps)]
        out["triton"].append({
            "block_h": bh, "block_kv": bkv, "num_warps": warps, "us": _stats_us(us),
            "max_err_out": float((got_o - want_o).abs().max()),
            "max_err_lse": float((got_l - want_l).abs()[fin].max()) if bool(fin.any()) else 0.0,
            "lse_finite_pattern_equal": bool(torch.equal(torch.isfinite(got_l), fin))})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--steps", type=int, default=22, help="resolver steps (2 warm-up; default 22)")
    p.add_argument("--heads", type=int, default=128, help="query heads (default 128)")
    p.add_argument("--decode-tokens", type=int, default=None, help="query tokens (default 64 on CUDA, 8 on CPU)")
    p.add_argument("--decode-rows", type=int, default=None, help="hot rows (default batch*slots on CUDA, 20000 on CPU)")
    p.add_argument("--decode-reps", type=int, default=10, help="timed decode calls (default 10)")
    p.add_argument("--out", default=None, help="also write the JSON result here")
    args = p.parse_args(argv)
    apply_threads(args)
    load_before = os.getloadavg()[0]
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device; run without --device on CPU")
    args.decode_tokens = args.decode_tokens or (64 if cuda else 8)
    args.decode_rows = args.decode_rows or (args.batch * args.slots if cuda else 20000)
    print(f"[kernels bench] device {args.device}, batch {args.batch}, k {args.k}, N {args.slots}, "
          f"context {args.context}, torch threads {torch.get_num_threads()}", flush=True)
    tr = trace(torch.Generator().manual_seed(0), args.batch, args.k, args.context, args.steps, args.repeat)
    res = {"goal_us_per_layer": 50, "torch": _stats_us(resolver_eager(args, tr, "torch"))}
    print(f"resolver torch path: median {res['torch']['median']:.0f} us "
          f"(min {res['torch']['min']:.0f}, max {res['torch']['max']:.0f})", flush=True)
    if cuda:
        res["triton_eager"] = _stats_us(resolver_eager(args, tr, "triton"))
        res["triton_graph_replay"] = _stats_us(resolver_graph(args, tr))
        res["triton_configs"] = []
        for bk, bn, w in RESOLVER_CONFIGS:
            st = _stats_us(resolver_eager(args, tr, "triton", block_k=bk, block_n=bn, num_warps=w))
            res["triton_configs"].append({"block_k": bk, "block_n": bn, "num_warps": w, "us": st})
        for key in ("triton_eager", "triton_graph_replay"):
            print(f"resolver {key}: median {res[key]['median']:.1f} us (min {res[key]['min']:.1f}, "
                  f"max {res[key]['max']:.1f}; goal <= 50)", flush=True)
    else:
        res["triton"] = "not timed: on CPU the kernel runs only under TRITON_INTERPRET=1"
        print("resolver Triton kernel: not timed on CPU (the interpreter is not a timing)", flush=True)
    dec = decode_bench(args)
    print(f"sparse decode reference: median {dec['reference_us']['median']:.0f} us", flush=True)
    for c in dec["triton"] if isinstance(dec["triton"], list) else []:
        print(f"sparse decode triton (block_h {c['block_h']}, block_kv {c['block_kv']}, warps "
              f"{c['num_warps']}): median {c['us']['median']:.0f} us, max err out {c['max_err_out']:.2e}, "
              f"lse {c['max_err_lse']:.2e}", flush=True)
    path = write_result(f"kernels_{'cuda' if cuda else 'cpu'}",
                        {"config": vars(args), "torch_threads": torch.get_num_threads(),
                         "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
                         "resolver_us_per_layer_step": res, "sparse_decode": dec}, also_to=args.out)
    print(f"wrote {path}" + (f" and {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
