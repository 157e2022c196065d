"""Speculative-prefetch predictors against exact LRU, replayed from top-k traces:

  python -m bench prefetch --predictors last_step,next_layer,score_ema,lstm [--trace FILE]
        [--layers 61 --k 128 --context 2048 --steps 80 --requests 2 --ratio 0.2 --seed 0]
        [--spec-rows-per-request K/8] [--min-precision 0.1 --window 64] [--checkpoint CKPT]
        [--model-batch 64 --model-context 32768 --overlap da] [--out PATH] [--threads 1]

Traces: always a SYNTHETIC one (sgl_ess/prefetch/synthetic_trace.py: DeepSeek-V3.2's measured
adjacent-step overlap and miss-peak layer; everything else, including how predictable misses are, is
the generator's assumption; its layers are independent, so next_layer has nothing to find there),
and, with --trace, a recorded one (`python -m bench trace --out FILE`). A trace of the embedded model
(sgl_ess/models/tiny_dsv32) comes from RANDOM weights: it says nothing about real locality.

Each trace is replayed through the real LatentStore (CPU, inline engine; store/trace_replay.py) once
without speculation and once per predictor, with the store's precision gate on. Per predictor:
  misses     exact-LRU misses per request per layer per step (hot buffer = --ratio x context)
  precision  rows used / rows staged (used = staged rows the target layer then missed on)
  recall     misses served from the speculative rows / misses
  wasted     rows staged and never used, and their bytes at DeepSeek-V3.2's 656 B per row
  cpu_us     the predictor's CPU time per decode step (all layers), measured in the replay
  fallbacks  switches to plain LRU by the precision gate (and back: resumes)
  exposed    MODELLED, not measured: the immediate tier's exposed fetch time per decode step at
             DeepSeek-V3.2 shapes (sgl_ess/sim/layer_exposure.py: --model-batch requests at
             --model-context, --overlap, FlashTrans rates), miss counts scaled by 2048 / k; staged
             rows for layer l travel in the link time layer l-1 leaves after its own fetch, and only
             the part that fits lands in time.
The lstm predictor uses --checkpoint, else one trained here on a held-out synthetic trace (seed + 1).
Results: bench/results/prefetch_predictors.json (command, commit, versions) and --out.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.meta import write_result
from sgl_ess.prefetch.predictors import PREDICTORS
from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate
from sgl_ess.prefetch.trace_format import read_trace
from sgl_ess.sim.config import OffloadConfig, SimConfig, WorkloadConfig
from sgl_ess.sim.layer_exposure import LayerExposureModel
from sgl_ess.sim.transfer import transfer_us
from sgl_ess.store.speculative import SpeculativeOptions
from sgl_ess.store.trace_replay import ReplayResult, replay

ROW_BYTES = 656   # DeepSeek-V3.2 FP8 FlashMLA latent row


def trace_label(header: dict) -> str:
    if header.get("source") == "synthetic":
        return "synthetic (DeepSeek-V3.2 overlap statistics; predictability is the generator's assumption)"
    model = str(header.get("model", ""))
    if "tiny_dsv32" in model:
        return "embedded model tiny_dsv32, RANDOM WEIGHTS: says nothing about real locality"
    return f"recorded ({header.get('source')}, model {model or 'unknown'})"


def exposure(model: LayerExposureModel, off: ReplayResult, res: ReplayResult | None, k: int) -> dict:
    """Modelled exposed immediate-fetch time per decode step (us), without and with speculation."""
    scale = model.topk / k
    rows = np.maximum(off.rows_per_layer, 1)
    miss = off.misses_per_layer / rows * scale
    used = (res.used_per_layer / rows * scale) if res else np.zeros_like(miss)
    staged = (res.staged_per_layer / rows * scale) if res else np.zeros_like(miss)
    L = miss.size
    b = model.cfg.work.batch
    without = sum(model.at(float(m)).exposed_us for m in miss)
    landed = np.ones(L)
    for layer in range(L):
        spec_us = transfer_us(b * float(staged[layer]), model.row_bytes, model.h2d)
        if spec_us > 0:
            prev = (layer - 1) % L
            spare = model.at(float(miss[prev] - used[prev])).spare_link_us
            landed[layer] = min(1.0, spare / spec_us)
    with_spec = sum(model.at(float(miss[layer] - used[layer] * landed[layer])).exposed_us for layer in range(L))
    return {"exposed_us_per_step_without_spec": round(without, 1), "exposed_us_per_step_with_spec": round(with_spec, 1),
            "landed_fraction_mean": round(float(landed.mean()), 4)}


def summarize(res: ReplayResult, off: ReplayResult, k: int, model: LayerExposureModel) -> dict:
    misses = off.misses
    assert res.misses == misses, "speculation changed the LRU's misses"     # it never touches LRU state
    row = {"predictor": res.predictor, "misses_per_request_layer_step": round(misses / max(1, off.rows_per_layer.sum()), 3),
           "rows_staged": res.staged, "rows_used": res.used,
           "precision": round(res.used / res.staged, 4) if res.staged else None,
           "recall": round(res.used / misses, 4) if misses else None,
           "wasted_rows": res.staged - res.used, "wasted_bytes_at_656B": (res.staged - res.used) * ROW_BYTES,
           "cpu_us_per_step": round(res.predict_us / max(1, res.steps), 1),
           "fallbacks": res.gate.get("fallbacks", 0), "resumes": res.gate.get("resumes", 0),
           "gate_mode_at_end": res.gate.get("mode"), "shadow_precision": (
               round(res.gate["rows_shadow_used"] / res.gate["rows_shadow"], 4) if res.gate.get("rows_shadow") else None),
           "state": res.state}
    row.update(exposure(model, off, res, k))
    return row


def lstm_predictor(args, cfg: SyntheticTraceConfig, header: dict, log):
    from sgl_ess.prefetch.lstm_predictor import LstmPredictor
    from sgl_ess.prefetch.predictors import PredictorContext

    ctx = PredictorContext(int(header["num_layers"]), int(header["topk"]), int(header["max_context_tokens"]),
                           args.checkpoint)
    if args.checkpoint:
        p = LstmPredictor(ctx)
        return p, {"checkpoint": args.checkpoint, "trained_on": p.meta.get("trained_on", {}).get("source")}
    if not hasattr(args, "_lstm"):
        from dataclasses import replace

        from sgl_ess.prefetch.train_lstm import train

        t0 = time.monotonic()
        model, metrics = train(generate(replace(cfg, seed=cfg.seed + 1)), max_seconds=args.train_seconds,
                               log=lambda m: None)
        args._lstm = (model, {"checkpoint": None, "trained_on": f"synthetic, seed {cfg.seed + 1} (held out)",
                              "train_seconds": round(time.monotonic() - t0, 1), "held_out": metrics["held_out"]})
        log(f"  lstm trained on a held-out synthetic trace: {args._lstm[1]}")
    model, info = args._lstm
    return LstmPredictor(ctx, model=model, meta={"horizon": 24, "threshold": args.lstm_threshold}), info


def run_trace(trace, args, cfg, model: LayerExposureModel, log) -> dict:
    label = trace_label(trace.header)
    k = trace.topk
    n = args.hot_slots or int(trace.header["hot_slots_per_request"])
    opts = SpeculativeOptions(min_precision=args.min_precision, window=args.window)
    spec_rows = args.spec_rows_per_request or max(1, k // 8)
    log(f"\n== {label}\n   {trace.num_layers} layers, top-k {k}, hot slots {n}, {spec_rows} speculative rows per "
        f"request, {sum(1 for _ in trace.plans())} plans")
    t0 = time.monotonic()
    off = replay(trace, "off", n)
    log(f"   LRU only: {off.misses} misses in {off.steps} steps ({time.monotonic() - t0:.1f} s)")
    base = {"predictor": "off (LRU only)", "misses_per_request_layer_step":
            round(off.misses / max(1, off.rows_per_layer.sum()), 3), **exposure(model, off, None, k)}
    rows, extra = [base], {}
    for name in args.predictors:
        t0 = time.monotonic()
        if name == "lstm":
            pred, extra["lstm"] = lstm_predictor(args, cfg, trace.header, log)
            res = replay(trace, hot_slots=n, spec_rows_per_request=spec_rows, options=opts, predictor=pred)
        else:
            res = replay(trace, name, n, spec_rows, opts)
        rows.append(summarize(res, off, k, model))
        log(f"   {name}: replayed in {time.monotonic() - t0:.1f} s")
    return {"label": label, "header": {k_: v for k_, v in trace.header.items() if k_ != "configured_overlap"},
            "hot_slots": n, "spec_rows_per_request": spec_rows, "misses_per_layer": (
                off.misses_per_layer / np.maximum(off.rows_per_layer, 1)).round(3).tolist(), "rows": rows, **extra}


COLS = [("predictor", "predictor", 16), ("precision", "precision", 9), ("recall", "recall", 7),
        ("rows_staged", "staged", 8), ("rows_used", "used", 6), ("wasted_bytes_at_656B", "wasted B", 10),
        ("cpu_us_per_step", "cpu us/step", 11), ("fallbacks", "fallbk", 6), ("shadow_precision", "shadow p", 8),
        ("exposed_us_per_step_without_spec", "exp us off*", 11), ("exposed_us_per_step_with_spec", "exp us on*", 10)]


def print_table(res: dict) -> None:
    print(f"\n{res['label']}\n" + " ".join(f"{h:>{w}}" for _, h, w in COLS))
    for row in res["rows"]:
        print(" ".join(f"{'' if row.get(c) is None else row.get(c):>{w}}" for c, _, w in COLS))
    print("* exposed: MODELLED immediate-fetch time per decode step at DeepSeek-V3.2 shapes (not measured)")


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench prefetch --predictors", description=__doc__.split("\n\n")[0])
    p.add_argument("--predictors", required=True, help="comma list of " + ", ".join(x for x in PREDICTORS if x != "off"))
    p.add_argument("--trace", default="", help="a recorded sgl_ess.topk_trace/1 file, replayed as well")
    p.add_argument("--layers", type=int, default=61)
    p.add_argument("--k", type=int, default=128, help="synthetic top-k (default 128: the 2048 / 32K ratio at 2K)")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--ratio", type=float, default=0.2, help="synthetic hot buffer = ratio x context (paper: 0.2)")
    p.add_argument("--hot-slots", type=int, default=0, help="override the hot buffer of every trace")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--spec-rows-per-request", type=int, default=0, help="speculative rows per request (0 = k / 8)")
    p.add_argument("--min-precision", type=float, default=0.1, help="the precision gate (--ess-predictor-min-precision)")
    p.add_argument("--window", type=int, default=64, help="the gate's window (--ess-predictor-window)")
    p.add_argument("--checkpoint", default="", help="lstm checkpoint (default: train one on a held-out synthetic trace)")
    p.add_argument("--train-seconds", type=float, default=30.0, help="lstm trained here: time budget")
    p.add_argument("--lstm-threshold", type=float, default=0.1, help="lstm trained here: P at which it stages")
    p.add_argument("--model-batch", type=int, default=64, help="exposure model: requests per GPU")
    p.add_argument("--model-context", type=int, default=32768, help="exposure model: context tokens")
    p.add_argument("--overlap", default="da", choices=("none", "da", "dba", "full"), help="exposure model: overlap")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: a shared machine)")
    a = p.parse_args(argv)
    a.predictors = [x for x in a.predictors.split(",") if x]
    bad = [x for x in a.predictors if x not in PREDICTORS or x == "off"]
    if bad:
        p.error(f"--predictors {','.join(bad)}: unknown; expected a comma list of "
                + ", ".join(x for x in PREDICTORS if x != "off"))
    return a


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    cfg = SyntheticTraceConfig(num_layers=args.layers, topk=args.k, context_tokens=args.context, steps=args.steps,
                               requests=args.requests, hot_slots_per_request=max(args.k + 1, round(args.ratio * args.context)),
                               seed=args.seed)
    model = LayerExposureModel(SimConfig(work=WorkloadConfig(context_tokens=args.model_context, mtp=1,
                                                             batch=args.model_batch),
                                         ess=OffloadConfig(ratio=args.ratio, overlap=args.overlap)))
    t0 = time.monotonic()
    synthetic = generate(cfg)
    print(f"synthetic trace generated in {time.monotonic() - t0:.1f} s (SYNTHETIC: {synthetic.header['note']})")
    results = [run_trace(synthetic, args, cfg, model, print)]
    if args.trace:
        results.append(run_trace(read_trace(args.trace), args, cfg, model, print))
    for res in results:
        print_table(res)
    path = write_result("prefetch_predictors", {
        "suite": "prefetch --predictors", "synthetic_config": cfg.__dict__, "exposure_model": {
            "modelled": True, "model": "deepseek_v32_exp", "batch": args.model_batch, "context": args.model_context,
            "overlap": args.overlap, "source": "sgl_ess/sim/layer_exposure.py", "scaled_to_topk": model.topk},
        "traces": results}, args.out)
    print(f"\nresults: {path}")
    return 0
