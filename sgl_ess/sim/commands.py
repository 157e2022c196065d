"""The CLI subcommands run, plan, sweep, sensitivity and the no-argument headline (reports.py has the
protocol commands: validate, fit, constants, profile). Each turns parsed args into simulations and
prints a table or JSON."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from .cli import build_configs, build_group, print_json_rows
from .config import ModelSpec, ServingLayoutConfig, SimConfigError
from .constants import const
from .fit import headline_rows, kernel_overhead_for, kernel_scale_for
from .hardware import get_hardware
from .host_pools import HostPoolReport, host_pool_report, report_lines, resolve_layout
from .launch_flags import LaunchPlan, launch_plan
from .planner import DEFAULT_RATIOS, PlanResult, plan, sizes
from .profile import OpProfile
from .sensitivity import sensitivity
from .step import StepResult, simulate
from .transfer import GB, h2d_bytes_per_s

RUN_COLUMNS = (("ctx", "context", "{:>7}"), ("mtp", "mtp", "{:>3}"), ("acc", "accept", "{:>5.2f}"),
               ("batch", "batch", "{:>5}"), ("ratio", "ratio", "{:>5.2f}"), ("overlap", "overlap", "{:>7}"),
               ("tok/s/node", "tokens_per_s_per_node", "{:>10.1f}"), ("tpot_ms", "tpot_ms", "{:>7.2f}"),
               ("step_ms", "step_ms", "{:>7.2f}"), ("maxfit", "max_batch_fits", "{:>6}"),
               ("miss/L", "misses_per_layer", "{:>6.1f}"), ("pcie%", "pcie_busy_fraction", "{:>5.1%}"),
               ("gpuGB", "gpu_mem_gb", "{:>6.1f}"), ("hostGB/node", "host_mem_gb_per_node", "{:>11.1f}"))


def table(rows: list[dict], columns) -> str:
    head = " ".join(f"{h:>{len(fmt.format(rows[0][k])) if rows else len(h)}}" for h, k, fmt in columns)
    return "\n".join([head] + [" ".join(fmt.format(r[k]) for _, k, fmt in columns) for r in rows])


def _breakdown(res: StepResult) -> str:
    parts = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in res.breakdown_us.items() if v > 0.05e3)
    return f"  batch {res.cfg.work.batch} r={res.cfg.ess.ratio:g}: step {res.step_us / 1e3:.1f} ms = {parts}"


def cmd_run(args: argparse.Namespace) -> int:
    results = [simulate(c, check=not args.no_fit_check) for c in build_configs(args, lists=True)]
    rows = [r.row() for r in results]
    if args.json:
        print_json_rows(rows)
        return 0
    print(table(rows, RUN_COLUMNS))
    prof = OpProfile.load(results[0].cfg.deploy.op_profile)
    d = results[0].cfg.deploy
    ko = kernel_overhead_for(prof, d.cuda_graph)
    print(f"step breakdown (ms); op profile {prof.name}; {ko:.2f} us per kernel launch (published, CUDA graphs "
          f"{'on' if d.cuda_graph else 'off'}); kernel time x {kernel_scale_for(prof):.3f} (fitted on DeepSeek's "
          f"decode deployment):")
    for r in results:
        print(_breakdown(r))
    return 0


def headline() -> int:
    names = ("hardware", "model", "op_profile", "nodes", "gpus_per_node", "ep", "gpu_mem_gb", "host_mem_gb",
             "context_tokens", "mtp", "accept", "output_tokens", "overlap", "transfer", "pcie_h2d_gbps", "hit_rate")
    args = argparse.Namespace(**dict.fromkeys(names), tbo=True, warmup=True, batch="52,160", ratio="1.0,0.21",
                              json=False, no_fit_check=True)
    print("ESS paper headline (arXiv 2512.10576, Table 2): 32K context, MTP 2, accept 1.7, 4x8 GPUs, EP 32, TBO\n")
    cmd_run(args)
    res = [simulate(c, check=False) for c in build_configs(args, lists=True)]
    paper = headline_rows()
    gain = res[1].tokens_per_s_per_node / res[0].tokens_per_s_per_node - 1
    paper_gain = paper[1]["tokens_per_s"] / paper[0]["tokens_per_s"] - 1
    print(f"\nESS gain: {gain:+.1%} (paper {paper_gain:+.1%})")
    for r, p, how in zip(res, paper, ("prediction", "prediction")):
        print(f"  batch {p['batch']} r={p['ratio']}: {r.tokens_per_s_per_node:.1f} tok/s vs paper "
              f"{p['tokens_per_s']} ({r.tokens_per_s_per_node / p['tokens_per_s'] - 1:+.2%}, {how})")
    print("every held-out point: python -m sgl_ess.sim validate")
    return 0


def parse_gpus(text: str) -> tuple[int, str | None]:
    """'8' -> (8, None); '8xH200' / '16x h800' -> (16, 'h800'): a count and optionally a GPU type."""
    from .hardware import known_hardware
    t = str(text).strip().lower().replace(" ", "")
    n, _, hw = t.partition("x")
    if not n.isdigit() or int(n) <= 0 or (hw and hw not in known_hardware()):
        raise SimConfigError(f"--gpus {text!r}: expected a GPU count N or NxGPU with GPU one of "
                             f"{', '.join(known_hardware())} (e.g. 8xH200); fix --gpus")
    return int(n), hw or None


def _plan_args(args: argparse.Namespace):
    if args.gpus is not None:
        n, hw = parse_gpus(args.gpus)
        if hw is not None:
            if args.hardware not in (None, hw):
                raise SimConfigError(f"--gpus {args.gpus} names {hw} but --hardware is {args.hardware}; expected "
                                     f"one GPU type; drop one of them")
            args.hardware = hw
        per = int(args.gpus_per_node or 8)
        if n % per:
            raise SimConfigError(f"--gpus {args.gpus}: expected a positive multiple of --gpus-per-node ({per})")
        args.nodes = str(n // per)
        if args.ep is None:
            args.ep = str(n)
    args.batch, args.ratio = None, None
    ratios = DEFAULT_RATIOS
    if args.ratios:
        try:
            ratios = tuple(float(x) for x in args.ratios.split(","))
        except ValueError:
            raise SimConfigError(f"--ratios {args.ratios!r}: expected a comma list of numbers in (0, 1]") from None
    cfg, serving = build_configs(args, lists=False)[0], build_group(args, ServingLayoutConfig)
    resolve_layout(serving, cfg.deploy)          # refuse an impossible layout before the search
    return cfg, ratios, serving


def _host_pools(res: PlanResult, cfg, serving: ServingLayoutConfig) -> HostPoolReport | None:
    """Host pools per node at the planned point (or at --max-total-tokens); None if neither is known."""
    if serving.max_total_tokens is not None:
        return host_pool_report(serving, cfg.deploy, serving.max_total_tokens, "--max-total-tokens")
    if res.best is None:
        return None
    b, c = res.best.cfg.work.batch, res.best.cfg.work.context_tokens
    return host_pool_report(serving, cfg.deploy, b * c, f"batch {b} x context {c}")


def _launch(res: PlanResult, cfg, pools: HostPoolReport | None) -> LaunchPlan | None:
    """The launcher flags (and what --ess-explain prints for them) that serve the planned point."""
    if res.best is None or pools is None:
        return None
    b = res.best.cfg
    return launch_plan(pools, ModelSpec.load(cfg.deploy.model), b.work.batch, b.ess.ratio, b.work.context_tokens,
                       b.work.mtp)


def assumptions(cfg, prof: OpProfile) -> list[str]:
    hw = get_hardware(cfg.deploy.hardware)
    d, w = cfg.deploy, cfg.work
    return [
        f"model {d.model}; {d.gpus} x {hw.name} ({hw.memory_bytes / GB:.0f} GB, HBM {hw.hbm_bytes_per_s / GB:.0f} GB/s, "
        f"PCIe {hw.pcie_bytes_per_s / GB:.0f} GB/s); DP attention, EP {d.ep}, TBO {'on' if d.tbo else 'off'}",
        f"every request at {w.context_tokens} tokens of context; MTP {w.mtp}, {w.accept_tokens:.3f} accepted tokens "
        f"per step; balanced expert routing",
        f"op profile {prof.name} ({'measured tables' if prof.tables else 'published kernel figures'}); "
        f"{kernel_overhead_for(prof, d.cuda_graph):.2f} us per kernel launch (published); kernel time x "
        f"{kernel_scale_for(prof):.3f} (fitted on DeepSeek's decode deployment); {const('non_cache_reserve_GB')} GB "
        f"non-cache reserve per GPU (SGLang's reserve floor, not fitted)",
        f"host->GPU {h2d_bytes_per_s(cfg.ess, hw) / GB:.1f} GB/s ({cfg.ess.transfer}); misses from exact LRU over a "
        f"synthetic locality trace (priors in data/constants.json); warmup {'on' if cfg.ess.warmup else 'off'}",
        "accuracy: see `python -m sgl_ess.sim validate` (errors on the paper's held-out points)",
    ]


def _plan_json(res: PlanResult, cfg, prof, pools: HostPoolReport | None) -> dict:
    return {"baseline": res.baseline.row() if res.baseline else None,
            "best": res.best.row() if res.best else None,
            "sizes": sizes(res.best) if res.best else None,
            "gain_pct": None if res.gain is None else round(100 * res.gain, 2),
            "binding": res.binding, "binding_why": res.binding_why,
            "relief_gain_pct": {k: round(100 * v, 2) for k, v in res.relief_gain.items()},
            "by_overlap": {k: v.row() for k, v in res.by_overlap.items()},
            "by_ratio": [r.row() for r in res.by_ratio],
            "host_pools": pools.as_dict() if pools else None,
            "launch": (lambda lp: lp.as_dict() if lp else None)(_launch(res, cfg, pools)),
            "assumptions": assumptions(cfg, prof)}


def write_plan_plot(path: str, cfg, res: PlanResult, slo_tpot_ms: float | None) -> str:
    from .plan_curves import curves
    from .plot import plot_plan
    b = res.best
    chosen = None if b is None else {"batch": b.cfg.work.batch, "tokens_per_s": b.tokens_per_s_per_node,
                                     "label": f"plan: batch {b.cfg.work.batch}, binding {res.binding}"}
    d, w = cfg.deploy, cfg.work
    title = (f"{d.model} on {d.gpus} x {d.hardware} (EP {d.ep}), context {w.context_tokens}, MTP {w.mtp}"
             f"{'' if slo_tpot_ms is None else f', SLO {slo_tpot_ms:g} ms'}"
             f"{'' if d.host_mem_gb is None else f', host {d.host_mem_gb:g} GB/node'}")
    return plot_plan(path, curves(cfg, res, slo_tpot_ms), chosen, title)


def plan_curves_json(cfg, res: PlanResult, slo_tpot_ms: float | None) -> list[dict]:
    from .plan_curves import curves
    return [asdict(c) for c in curves(cfg, res, slo_tpot_ms)]


def cmd_plan(args: argparse.Namespace) -> int:
    cfg, ratios, serving = _plan_args(args)
    res = plan(cfg, args.slo_tpot_ms, ratios)
    prof = OpProfile.load(cfg.deploy.op_profile)
    pools = _host_pools(res, cfg, serving)
    if args.json:
        out = _plan_json(res, cfg, prof, pools)
        if args.plot:
            out["plot"] = write_plan_plot(args.plot, cfg, res, args.slo_tpot_ms)
            out["curves"] = plan_curves_json(cfg, res, args.slo_tpot_ms)
        print(json.dumps(out, indent=1))
        return 0
    if res.best is None:
        raise SimConfigError("no batch fits or meets the SLO at any ratio; relax --slo-tpot-ms, shorten --context "
                             "or add memory (--gpu-mem-gb, --host-mem-gb, --gpus)")
    print("per ratio (largest batch that fits and meets the SLO):")
    print(table([r.row() for r in res.by_ratio], RUN_COLUMNS))
    b = res.best
    s = sizes(b)
    print(f"\nanswer: batch {b.cfg.work.batch} per GPU at ratio {b.cfg.ess.ratio:g}, overlap "
          f"{b.cfg.ess.overlap if b.cfg.ess.offload else 'off (no offload)'}")
    print(f"  expected {b.tokens_per_s_per_node:.0f} tok/s per node, {b.tokens_per_s_per_node * cfg.deploy.nodes:.0f} "
          f"in total; TPOT {b.tpot_ms:.2f} ms{'' if args.slo_tpot_ms is None else f' (SLO {args.slo_tpot_ms:g})'}")
    rest = (f", + {s['ess_store_rest_gb_per_gpu']:.2f} GB the rest of the ESS store (rings, MTP scratch rows, LRU "
            f"tables, token map)" if "ess_store_rest_gb_per_gpu" in s else "")
    print(f"  hot buffer: {s['hot_slots_per_request_layer']} slots per request per layer = "
          f"{s['hot_buffer_gb_per_gpu']:.1f} GB per GPU (+ {s['indexer_keys_gb_per_gpu']:.1f} GB indexer keys{rest}); "
          f"GPU total {s['gpu_used_gb']:.1f} GB")
    print(f"  host pool: {s['host_pool_gb_per_node']:.0f} GB per node (pinned); PCIe busy {b.pcie_busy_fraction:.0%}")
    lp = _launch(res, cfg, pools)
    if lp is not None:
        level, note = b.cfg.ess.overlap, ""
        if level == "full" and b.strategies:      # the launcher's full reads a measured per-layer profile instead
            level = max(b.strategies, key=b.strategies.get)
            note = (f" (the plan's 'full' chose per layer x micro-batch: "
                    f"{', '.join(f'{k} {v}' for k, v in sorted(b.strategies.items()))}; the launcher's full reads "
                    f"a measured per-layer profile, --ess-overlap-profile)")
        print(f"  launch: python -m sgl_ess.launch_server --model-path MODEL {' '.join(lp.argv)} "
              f"--ess-prefetch-overlap-level {level}{note}")
        print(f"    --ess-explain prints for these flags: {lp.tokens_per_pool} tokens per pool, {lp.pools_per_node} "
              f"host pool(s) per node = {lp.host_bytes_per_node / GB:.1f} GB per node, {lp.hot_slots_per_request} "
              f"hot slots per request per layer, {lp.device_bytes_per_gpu / GB:.2f} GB ({lp.device_bytes_per_gpu} B) "
              f"device bytes per GPU for the ESS store ({lp.request_rows} request rows; by tensor: "
              f"{', '.join(f'{k} {v}' for k, v in lp.device_allocation if v)})")
    print(f"  binding resource: {res.binding} - {res.binding_why}")
    if res.baseline is not None:
        print(f"  no offload: batch {res.baseline.cfg.work.batch}, {res.baseline.tokens_per_s_per_node:.0f} "
              f"tok/s/node -> ESS gain {res.gain:+.1%}")
    else:
        print("  no offload: nothing fits or meets the SLO")
    for line in report_lines(pools, serving.share_host_pool):
        print(line)
    if args.plot:
        print(f"wrote {write_plan_plot(args.plot, cfg, res, args.slo_tpot_ms)}")
    print(f"  (the host pool line above is the step model's: one pool per GPU, {s['host_pool_gb_per_node']:.0f} GB "
          f"over the {ModelSpec.load(cfg.deploy.model).cached_layers} cached layers, MTP included, no padding page)")
    print("assumptions:")
    for a in assumptions(cfg, prof):
        print(f"  - {a}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    args.ratio, args.batch = None, None
    base = build_configs(args, lists=False)[0]
    try:
        batches = [int(x) for x in args.batches.split(",")]
        ratios = [float(x) for x in args.ratios.split(",")]
    except ValueError:
        raise SimConfigError(f"--batches {args.batches!r} / --ratios {args.ratios!r}: expected comma lists of "
                             f"integers / numbers") from None
    brows = []
    fit1 = fit2 = None
    for b in batches:
        no = simulate(replace(base, work=replace(base.work, batch=b), ess=replace(base.ess, ratio=1.0)), check=False)
        es = simulate(replace(base, work=replace(base.work, batch=b), ess=replace(base.ess, ratio=args.ess_ratio)),
                      check=False)
        fit1, fit2 = no.memory.max_batch, es.memory.max_batch
        brows.append({"batch": b, "ratio": args.ess_ratio, "no_offload": no.tokens_per_s_per_node,
                      "ess": es.tokens_per_s_per_node, "max_fit_no_offload": fit1, "max_fit_ess": fit2})
    if base.work.context_tokens == 32768 and base.work.mtp == 2:
        from .fit import published
        brows[0]["paper"] = published()["figure1_throughput_vs_batch_32k_mtp2_unconstrained_memory"]
    rrows = []
    for r in ratios:
        if r * base.work.context_tokens < 2048:
            continue
        res = simulate(replace(base, ess=replace(base.ess, ratio=r)), check=False)
        m = res.misses_per_layer[:-1]
        rrows.append({"ratio": r, "misses_mean": float(m.mean()), "misses_max": float(m.max()),
                      "max_batch_fits": res.memory.max_batch})
    if args.json:
        print(json.dumps({"throughput_vs_batch": [{k: v for k, v in r.items() if k != "paper"} for r in brows],
                          "misses_vs_ratio": rrows}, indent=1))
    else:
        print(f"throughput vs batch (tok/s/node); memory limits: no offload {fit1}, ESS r={args.ess_ratio:g} {fit2}")
        print(f"{'batch':>5} {'no_offload':>10} {'ess':>10}")
        for r in brows:
            print(f"{r['batch']:>5} {r['no_offload']:>10.0f} {r['ess']:>10.0f}")
        print("\nmisses per request per layer per step vs ratio")
        print(f"{'ratio':>5} {'mean':>7} {'max':>7} {'maxfit':>6}")
        for r in rrows:
            print(f"{r['ratio']:>5.2f} {r['misses_mean']:>7.1f} {r['misses_max']:>7.1f} {r['max_batch_fits']:>6}")
    if args.plot:
        from .plot import plot_sweep
        title = (f"{base.deploy.hardware}, context {base.work.context_tokens}, MTP {base.work.mtp}, "
                 f"accept {base.work.accept_tokens:.2f}")
        print(f"wrote {plot_sweep(args.plot, brows, rrows, title)}")
    return 0


def cmd_sensitivity(args: argparse.Namespace) -> int:
    if args.batch is None:
        args.batch = "160"
    if args.ratio is None:
        args.ratio = "0.21"
    cfg = build_configs(args, lists=False)[0]
    rows = sensitivity(cfg, args.baseline_batch)
    if args.json:
        print_json_rows([asdict(r) for r in rows])
        return 0
    print(f"gain of ESS (batch {cfg.work.batch}, r={cfg.ess.ratio:g}) over no offload (batch {args.baseline_batch}), "
          f"context {cfg.work.context_tokens}, MTP {cfg.work.mtp}")
    print(f"{'knob':>14} {'value':>10} {'tok/s/node':>10} {'gain':>8} {'ess_ms':>7} {'pcie':>6}")
    for r in rows:
        print(f"{r.knob:>14} {r.value:>10} {r.tokens_per_s_per_node:>10.0f} {r.gain_pct:>+7.1f}% "
              f"{r.ess_exposed_ms:>7.2f} {r.pcie_busy_fraction:>6.1%}")
    return 0
