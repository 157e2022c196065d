"""The CLI subcommands: each turns parsed args into simulations and prints a table or JSON."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, replace

from .calibrate import calibration_rows, calibration_table, figure1_points, fit, stored_fit
from .cli import build_configs, print_json_rows
from .config import SimConfigError
from .hardware import get_hardware
from .ops import AnalyticalProfile, MeasuredProfile
from .planner import plan
from .sensitivity import sensitivity
from .step import StepResult, simulate

RUN_COLUMNS = (("ctx", "context", "{:>7}"), ("mtp", "mtp", "{:>3}"), ("acc", "accept", "{:>5.2f}"),
               ("batch", "batch", "{:>5}"), ("ratio", "ratio", "{:>5.2f}"), ("overlap", "overlap", "{:>7}"),
               ("tok/s/node", "tokens_per_s_per_node", "{:>10.1f}"), ("otps", "otps", "{:>6.2f}"),
               ("step_ms", "step_ms", "{:>7.2f}"), ("maxfit", "max_batch_fits", "{:>6}"),
               ("miss/L", "misses_per_layer", "{:>6.1f}"), ("pcie%", "pcie_busy_fraction", "{:>5.1%}"),
               ("gpuGB", "gpu_mem_gb", "{:>6.1f}"), ("hostGB/node", "host_mem_gb_per_node", "{:>11.1f}"))


def _table(rows: list[dict], columns) -> str:
    head = " ".join(f"{h:>{len(fmt.format(rows[0][k])) if rows else len(h)}}" for h, k, fmt in columns)
    lines = [head]
    for r in rows:
        lines.append(" ".join(fmt.format(r[k]) for _, k, fmt in columns))
    return "\n".join(lines)


def _breakdown(res: StepResult) -> str:
    parts = ", ".join(f"{k} {v / 1e3:.1f}" for k, v in res.breakdown_us.items() if v > 0.05e3)
    return f"  batch {res.cfg.work.batch} r={res.cfg.ess.ratio:g}: step {res.step_us / 1e3:.1f} ms = {parts}"


def cmd_run(args: argparse.Namespace) -> int:
    cfgs = build_configs(args, lists=True)
    results = []
    for c in cfgs:
        prof = None
        if args.op_profile:
            prof = MeasuredProfile(args.op_profile, AnalyticalProfile(get_hardware(c.deploy.hardware)))
        results.append(simulate(c, profile=prof, check=not args.no_fit_check))
    rows = [r.row() for r in results]
    if args.json:
        print_json_rows(rows)
        return 0
    print(_table(rows, RUN_COLUMNS))
    print("step breakdown (ms):")
    for r in results:
        print(_breakdown(r))
    return 0


def headline() -> int:
    args = argparse.Namespace(**{k: None for k in ("hardware", "nodes", "gpus_per_node", "ep", "gpu_mem_gb",
                                                    "host_mem_gb", "context_tokens", "mtp", "accept",
                                                    "output_tokens", "overlap", "transfer", "pcie_h2d_gibps",
                                                    "hit_rate")},
                              tbo=True, warmup=True, batch="52,160", ratio="1.0,0.21", json=False,
                              no_fit_check=False, op_profile=None)
    print("ESS paper headline (arXiv 2512.10576, Table 2): 32K context, MTP 2, accept 1.7, 4x8 GPUs, EP 32, TBO\n")
    cmd_run(args)
    res = [simulate(c) for c in build_configs(args, lists=True)]
    paper = calibration_rows()
    gain = res[1].tokens_per_s_per_node / res[0].tokens_per_s_per_node - 1
    paper_gain = paper[1]["tokens_per_s"] / paper[0]["tokens_per_s"] - 1
    print(f"\nESS gain: {gain:+.1%} (paper {paper_gain:+.1%})")
    for r, p in zip(res, paper):
        print(f"  batch {p['batch']} r={p['ratio']}: {r.tokens_per_s_per_node:.1f} tok/s vs paper "
              f"{p['tokens_per_s']} ({r.tokens_per_s_per_node / p['tokens_per_s'] - 1:+.2%}); otps {r.otps:.2f} "
              f"vs {p['otps']}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    if args.gpus is not None:
        per = int(args.gpus_per_node or 8)
        if args.gpus <= 0 or args.gpus % per:
            raise SimConfigError(f"--gpus {args.gpus}: expected a positive multiple of --gpus-per-node ({per})")
        args.nodes = str(args.gpus // per)
        if args.ep is None:
            args.ep = str(args.gpus)
    args.batch, args.ratio = None, None
    cfg = build_configs(args, lists=False)[0]
    res = plan(cfg, args.slo_tpot_ms)
    if args.json:
        out = {"baseline": res.baseline.row() if res.baseline else None,
               "best": res.best.row() if res.best else None,
               "gain_pct": None if res.gain is None else round(100 * res.gain, 2),
               "by_overlap": {k: v.row() for k, v in res.by_overlap.items()},
               "by_ratio": [r.row() for r in res.by_ratio]}
        print(json.dumps(out, indent=1))
        return 0
    if res.best is None:
        raise SimConfigError("no batch fits or meets the SLO at any ratio; relax --slo-tpot-ms, shorten --context "
                             "or add memory (--gpu-mem-gb, --host-mem-gb)")
    print("per ratio (largest batch that fits and meets the SLO):")
    print(_table([r.row() for r in res.by_ratio], RUN_COLUMNS))
    if res.by_overlap:
        print("\noverlap strategies at the best ratio:")
        print(_table([r.row() for r in res.by_overlap.values()], RUN_COLUMNS))
    b = res.best
    print(f"\nbest: batch {b.cfg.work.batch}, ratio {b.cfg.ess.ratio:g}, overlap "
          f"{b.cfg.ess.overlap if b.cfg.ess.offload else 'off'}: {b.tokens_per_s_per_node:.0f} tok/s/node, "
          f"TPOT {b.step_us / 1e3 / b.accept:.2f} ms, host {b.row()['host_mem_gb_per_node']} GB/node, "
          f"PCIe busy {b.pcie_busy_fraction:.0%}")
    if res.baseline is not None:
        print(f"no offload: batch {res.baseline.cfg.work.batch}: {res.baseline.tokens_per_s_per_node:.0f} tok/s/node"
              f" -> gain {res.gain:+.1%}")
    else:
        print("no offload: nothing fits or meets the SLO")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    args.ratio = None
    args.batch = None
    base = build_configs(args, lists=False)[0]
    batches = [int(x) for x in args.batches.split(",")]
    ratios = [float(x) for x in args.ratios.split(",")]
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
        brows[0]["paper"] = figure1_points()
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    fitted, stored = fit(), stored_fit()
    table = calibration_table()
    if args.json:
        print(json.dumps({"fitted": asdict(fitted), "stored": asdict(stored), "table": table}, indent=1))
        return 0
    print(f"refit on the calibration rows: {fitted}")
    print(f"stored in data/tuned_constants.json: {stored}")
    print(f"{'set':>22} {'batch':>5} {'ratio':>5} {'paper':>9} {'sim':>9} {'error':>7}")
    for r in table:
        print(f"{r['set']:>22} {r['batch']:>5} {r['ratio']:>5.2f} {r['paper_tokens_per_s']:>9.1f} "
              f"{r['sim_tokens_per_s']:>9.1f} {r['error_pct']:>+6.1f}%")
    return 0
