"""Store benchmark: resolver cost and LRU warmup effect, side by side in one run.

  python -m bench store [--batch 64 --k 2048 --slots 6400 --context 32768 --steps 12]

Prints and writes bench/results/store.json:
  1. resolver time per layer per step, interleaved on the same trace: the order-list algorithm's
     torch implementation (`assign(..., backend="torch")`), its numba CPU kernel (backend="numba",
     the CPU default when numba is installed; checked to give the same slots), the previous
     sort-based torch resolver (two [b, N] sorts per call; kept here as the baseline), and the
     plain Python OrderedDict oracle doing the same work (median and spread over steps). With
     --device cuda the Triton kernel (`backend="triton"`) is timed too; on CPU it runs only
     under TRITON_INTERPRET=1, which is not a timing (see `python -m bench kernels`);
  2. misses per request per layer on the first decode step and in steady state on a synthetic
     locality trace (each step keeps `--repeat` of the previous step's top-k): without LRU
     warmup, with the W-step replay (the earlier warmup) and with today's closed form, and
     each warmup's time (one call: a single timing, not a distribution);
  3. ATen ops, an estimate of kernel launches and host reads per decode layer-step of the device
     path (reserve + plan + land + commit through the side-stream engine, validate off), counted
     with the torch profiler on CPU (bench/op_count.py; a count, not a timing; issue 16's goal:
     <= 10 launches, no host read), and the device -> host syncs per prefill (extend) layer-step of
     the ESS path with the site of each (bench/op_count.count_extend_syncs; issue 32);
  4. shared-index layers on a GLM-5.2-shaped model (78 layers, 21 anchors, bench/shared_index.py): the
     group design (one slot table per group, resolved at the anchor, every layer planned early) next to
     the per-layer design: plans early / late per layer, resolver calls per step, bytes read equal.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from bench.meta import write_result
from bench.op_count import count_extend_syncs, count_plan_ops
from bench.shared_index import compare as shared_index_compare
from bench.workload_args import add_workload_args, apply_threads
from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.kernels.resolver_numba import available as numba_available
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign
from sgl_ess.store.warm_state import set_warm_state


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


def sort_resolver_baseline(state, reqs, seq_lens, tokens):
    """The previous torch resolver (before the order list): stamps + two [b, N] sorts per call.
    state: dict(s2t int64 [R, N], stamps int64 [R, N], clock int). Timed as the baseline only."""
    b, k = tokens.shape
    n = state["s2t"].shape[1]
    valid = tokens >= 0
    ar_k = torch.arange(k, device=tokens.device).expand(b, k)
    sorted_tok, perm = torch.sort(tokens, dim=1, stable=True)
    new_group = torch.ones_like(sorted_tok, dtype=torch.bool)
    new_group[:, 1:] = sorted_tok[:, 1:] != sorted_tok[:, :-1]
    grp_start = torch.where(new_group, ar_k, torch.zeros_like(ar_k)).cummax(dim=1).values
    first_idx = torch.empty_like(perm).scatter_(1, perm, perm.gather(1, grp_start))
    is_first = first_idx == ar_k
    s2t = state["s2t"].index_select(0, reqs)
    stamp = state["stamps"].index_select(0, reqs)
    res_sorted, res_order = torch.sort(s2t, dim=1)
    safe_tok = tokens.clamp(min=0).contiguous()
    pos = torch.searchsorted(res_sorted, safe_tok).clamp(max=n - 1)
    found = valid & (res_sorted.gather(1, pos) == tokens)
    hit_slot = res_order.gather(1, pos)
    miss = valid & ~found & is_first
    hit = found & is_first
    hit_target = torch.where(hit, hit_slot, torch.full_like(hit_slot, n))
    pinned = torch.zeros((b, n + 1), dtype=torch.bool, device=tokens.device).scatter_(1, hit_target, True)[:, :n]
    big = torch.iinfo(torch.int64).max
    victim_order = torch.sort(torch.where(pinned, torch.full_like(stamp, big), stamp), dim=1, stable=True).indices
    rank = (torch.cumsum(miss.to(torch.int64), dim=1) - 1).clamp(min=0).clamp(max=n - 1)
    miss_slot = torch.where((seq_lens <= n).unsqueeze(1), safe_tok.clamp(max=n - 1), victim_order.gather(1, rank))
    slots = torch.where(found, hit_slot, miss_slot).gather(1, first_idx)
    slots = torch.where(valid, slots, torch.full_like(slots, -1))
    target = torch.where(miss, miss_slot, torch.full_like(miss_slot, n))
    s2t_ext = torch.cat([s2t, s2t.new_full((b, 1), -1)], dim=1).scatter_(1, target, tokens)
    base, state["clock"] = state["clock"], state["clock"] + 2 * k
    touch = torch.where(valid, slots, torch.full_like(slots, n))
    when = ar_k + base + k * (valid & ~found).to(torch.int64)
    stamp_ext = torch.cat([stamp, stamp.new_full((b, 1), -1)], dim=1)
    stamp_ext.scatter_reduce_(1, touch, when, reduce="amax")
    state["s2t"].index_copy_(0, reqs, s2t_ext[:, :n])
    state["stamps"].index_copy_(0, reqs, stamp_ext[:, :n])
    return slots, miss, hit


def _clock(device):
    if device.startswith("cuda"):
        def timed(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        return timed

    def timed_cpu(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return timed_cpu


def time_resolver(args, g):
    """ms per call of each resolver on the same trace, interleaved step by step (so machine
    load hits them alike); the first two steps are warm-up. The sort baseline's misses are
    checked equal to the order list's (the same LRU)."""
    tr = trace(g, args.batch, args.k, args.context, args.steps + 2, args.repeat)
    dev = args.device
    reqs = torch.arange(args.batch, device=dev)
    lens = torch.full((args.batch,), args.context, device=dev)
    backends = ["torch", "triton"] if dev.startswith("cuda") else ["torch"] + (["numba"] if numba_available() else [])
    bufs = {be: DeviceHotBuffer(1, args.batch, args.slots, dev, max_context_tokens=args.context)
            for be in backends}
    base = {"s2t": torch.full((args.batch, args.slots), -1, dtype=torch.int64, device=dev),
            "stamps": torch.full((args.batch, args.slots), -1, dtype=torch.int64, device=dev), "clock": 0}
    timed = _clock(dev)
    ms = {be: [] for be in backends} | {"sort_baseline": []}
    for s in range(tr.shape[0]):
        t = tr[s].to(dev)
        out = {}
        calls = [(be, lambda be=be: assign(bufs[be], 0, reqs, lens, t, backend=be)) for be in backends]
        calls.append(("sort_baseline", lambda: sort_resolver_baseline(base, reqs, lens, t)))
        for name, call in (calls if s % 2 else calls[::-1]):   # alternate who runs first
            dt = timed(lambda: out.__setitem__(name, call()))
            if s >= 2:
                ms[name].append(dt)
        if not torch.equal(out["sort_baseline"][1].sum(1), out["torch"].miss.sum(1)):
            raise AssertionError(f"step {s}: sort baseline and order list disagree on misses")
        for be in backends[1:]:
            if not torch.equal(out[be].slots.cpu(), out["torch"].slots.cpu()):
                raise AssertionError(f"step {s}: {be} and torch resolvers disagree")
    oracles = [LruOracle(args.slots) for _ in range(args.batch)]
    lists = tr.tolist()
    ms["oracle"] = []
    for s in range(min(tr.shape[0], args.oracle_steps + 2)):
        t0 = time.perf_counter()
        for i in range(args.batch):
            oracles[i].access(lists[s][i])
        if s >= 2:
            ms["oracle"].append((time.perf_counter() - t0) * 1e3)
    return ms


WARM_MODES = ("none", "replay", "closed_form")


def warmup_misses(args, g, mode: str):
    """Misses per request per layer (first decode step, mean of later steps) and the warmup's
    time in ms. mode: none; replay = W resolver steps over the prefill's sets (the warmup
    before warm_state.py); closed_form = `set_warm_state`, today's warmup (the LRU state of the
    same W sets read as one stream)."""
    w = args.warmup_window
    tr = trace(g, args.batch, args.k, args.context, w + args.miss_steps, args.repeat)
    buf = DeviceHotBuffer(1, args.batch, args.slots, "cpu", max_context_tokens=args.context)
    rows = torch.arange(args.batch)
    lens = torch.full((args.batch,), args.context)
    t0 = time.perf_counter()
    if mode == "replay":   # the prefill's last W query positions' top-k (the trace before decode starts)
        for s in range(w):
            assign(buf, 0, rows, lens, tr[s])
    elif mode == "closed_form":
        set_warm_state(buf, 0, rows, lens, tr[:w].transpose(0, 1))
    warm_ms = (time.perf_counter() - t0) * 1e3
    per_step = []
    for s in range(w, tr.shape[0]):
        a = assign(buf, 0, rows, lens, tr[s])
        per_step.append(float(a.miss.sum()) / args.batch)
    return per_step[0], statistics.mean(per_step[len(per_step) // 2:]), warm_ms


def _stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench store", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(p)
    p.add_argument("--steps", type=int, default=12, help="timed resolver steps (default 12)")
    p.add_argument("--oracle-steps", type=int, default=4, help="timed oracle steps (slow; default 4)")
    p.add_argument("--warmup-window", type=int, default=32, help="W prefill positions (default 32)")
    p.add_argument("--miss-steps", type=int, default=20, help="decode steps for the miss figures")
    args = p.parse_args(argv)
    apply_threads(args)
    load_before = os.getloadavg()[0]
    g = torch.Generator().manual_seed(0)
    print(f"[store bench] batch {args.batch}, k {args.k}, N {args.slots}, context {args.context}, "
          f"device {args.device}, torch threads {torch.get_num_threads()}", flush=True)
    ms = time_resolver(args, g)
    st = {name: _stats(xs) for name, xs in ms.items()}
    for name, label in (("torch", "order list, torch (assign backend='torch')"),
                        ("triton", "order list, Triton kernel (backend='triton')"),
                        ("numba", "order list, numba CPU kernel (backend='numba')"),
                        ("sort_baseline", "previous sort-based torch resolver"),
                        ("oracle", "Python OrderedDict oracle")):
        if name in st:
            x = st[name]
            print(f"resolver per layer per step, {label}: {x['median']:.2f} ms (min {x['min']:.2f}, "
                  f"max {x['max']:.2f}, n {x['n']})", flush=True)
    if "triton" not in st:
        print("resolver Triton kernel: not timed on CPU (only the interpreter runs it there, which is "
              "not a timing); see python -m bench kernels --device cuda", flush=True)
    ratio_sort = st["sort_baseline"]["median"] / st["torch"]["median"]
    ratio_oracle = st["oracle"]["median"] / st["torch"]["median"]
    print(f"sort baseline / order list = {ratio_sort:.2f}x; oracle / order list = {ratio_oracle:.1f}x", flush=True)
    if "numba" in st:
        print(f"torch / numba (both the order list, same state) = {st['torch']['median'] / st['numba']['median']:.1f}x",
              flush=True)
    warm = {m: warmup_misses(args, torch.Generator().manual_seed(1), m) for m in WARM_MODES}
    print(f"misses per request per layer (k={args.k}, repeat {args.repeat}) and warmup time per layer "
          f"(batch {args.batch}, W={args.warmup_window}):")
    print(f"  {'':22}{'first step':>12}{'steady state':>14}{'warmup ms':>11}")
    for m, label in (("none", "no warmup"), ("replay", "replay W steps"), ("closed_form", "closed form (today)")):
        print(f"  {label:22}{warm[m][0]:12.1f}{warm[m][1]:14.1f}{warm[m][2]:11.1f}")
    print(f"  warmup time replay / closed form = {warm['replay'][2] / warm['closed_form'][2]:.1f}x "
          "(one call each: a single timing)")
    ops = count_plan_ops()
    print(f"device path per decode layer-step ({ops['shape']}): {ops['ops']} ATen ops, ~{ops['launch_estimate_cuda']} "
          f"kernel launches on CUDA (each resolver, plan-epilogue and FlashTrans call one Triton launch: "
          f"{ops['kernel_calls']}), {ops['host_reads']} host reads "
          "(goal: <= 10 launches, 0 host reads)", flush=True)
    graph_ops = count_plan_ops(padded=2)
    print(f"the same step as a decode CUDA graph holds it (--ess-cuda-graph; 2 of {graph_ops['shape']['batch']} rows "
          f"padding, padded=True): {graph_ops['ops']} ATen ops, ~{graph_ops['launch_estimate_cuda']} launches recorded "
          f"once, {graph_ops['host_reads']} host reads", flush=True)
    ext = count_extend_syncs()
    print(f"device -> host syncs per prefill (extend) layer-step of the ESS path ({ext['shape']}): {ext['syncs']} "
          "(goal: <= 1); where:", flush=True)
    for site, n in ext["sync_sites"].items():
        print(f"  {n} x {site}")
    shared = shared_index_compare()
    print(f"shared-index layers, {shared['model']}:")
    for key, label in (("per_layer_design", "per-layer design (one LRU per layer)"),
                       ("group_design", "group design (one slot table per group)")):
        x = shared[key]
        print(f"  {label:40} layers planned early {x['plans_early_layers']:3d}, late {x['plans_late_layers']:3d}; "
              f"resolver calls per step {x['resolver_calls_per_step']}; planning "
              f"{x['plan_cpu_ms_per_step_single_run']:.1f} ms/step (CPU, one run)")
    print(f"  bytes every layer read equal in both designs: {shared['outputs_equal']}", flush=True)
    path = write_result("store", {
        "config": vars(args), "torch_threads": torch.get_num_threads(),
        "loadavg_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "resolver_ms_per_layer_step": {
            "order_list_torch": st["torch"], "order_list_triton": st.get("triton", "not timed on CPU (interpreter only)"),
            "order_list_numba": st.get("numba", "not timed (CUDA run, or numba not installed)"),
            "sort_baseline_torch": st["sort_baseline"], "oracle": st["oracle"],
            "ratio_sort_baseline_over_order_list": ratio_sort, "ratio_oracle_over_order_list": ratio_oracle},
        "misses_per_request_layer": {m: {"first_step": warm[m][0], "steady": warm[m][1]} for m in WARM_MODES},
        "warmup_ms_per_layer": {m: warm[m][2] for m in WARM_MODES if m != "none"},
        "device_path_ops_per_layer_step": ops,
        "graph_path_ops_per_layer_step": {**graph_ops, "padding_rows": 2},
        "extend_syncs_per_layer_step": ext,
        "shared_index_layers": shared,
    })
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
