"""The protocol commands: validate (held-out errors), fit (one measured deployment), constants (one table of every
constant with its kind and source) and profile (load and summarize an op profile)."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from .config import ModelSpec, SimConfigError
from .constants import all_constants, const
from .fit import fit_reserve, fitted_now, stored_fit, write_constants
from .hardware import get_hardware
from .ops import attention_ops, embed_op, ffn_ops, head_ops, mtp_input_ops, resolve_op
from .profile import OpProfile
from .validate import GOAL, checks, fit_summary, worst

KIND_ORDER = {"sourced": 0, "published": 0, "paper": 1, "derived": 2, "prior": 3, "fitted": 4}


def cmd_validate(args: argparse.Namespace) -> int:
    prof = OpProfile.load(args.op_profile)
    rows, fs = checks(prof), fit_summary(prof)
    w = worst(rows)
    if args.json:
        print(json.dumps({"profile": prof.name, "fit": fs,
                          "checks": [dict(asdict(r), error=round(r.error, 2), within_goal=r.within_goal)
                                     for r in rows],
                          "worst": {k: dict(asdict(v), error=round(v.error, 2)) for k, v in w.items()}}, indent=1))
        return 0
    pt = fs["point"]
    print(f"op profile: {prof.name}")
    print(f"calibrated on ONE measured deployment: {pt['what']}: {pt['tokens_per_s_per_gpu']} tok/s per GPU "
          f"({fs['target_step_ms']:.2f} ms per step)")
    print(f"  kernel_time_scale = {fs['kernel_time_scale']:.4f} (without it: {fs['unscaled_tokens_per_s_per_gpu']:.0f} "
          f"tok/s per GPU, {fs['unscaled_error_pct']:+.1f}%); launches are not fitted: {fs['kernels_per_step']} per "
          f"step x {fs['launch_us']} us (published) = {fs['launch_share_of_step']:.1%} of that step")
    r = fit_reserve()
    print(f"non_cache_reserve_GB = {const('non_cache_reserve_GB')} (not fitted: SGLang's reserve floor, 10 GiB + 2 GiB "
          f"DeepEP; the paper's batch 52 at 32K, r=1 would imply {r.lo_gb:.2f} < reserve <= {r.hi_gb:.2f} GB)")
    print("every row below is held out; * = the published number is itself a simulation (the paper's own simulator: "
          "it reports no measurement)\n")
    width = max(len(c.point) for c in rows) + 2
    print(f"{'held-out point':<{width}} {'published':>10} {'simulated':>10} {'unit':>10} {'error':>9}  goal")
    for c in rows:
        sim = "-" if c.simulated is None else f"{c.simulated:.1f}"
        goal = "not covered" if not c.covered else ("met" if c.within_goal else "MISSED")
        print(f"{c.point + (' *' if c.simulated_source else ''):<{width}} {c.published:>10.1f} {sim:>10} {c.unit:>10} "
              f"{c.error_text:>9}  {goal}")
    print("\nsources:")
    for src in dict.fromkeys(c.source for c in rows):
        print(f"  - {src}")
    print("\nnot covered, and why:")
    for c in rows:
        if not c.covered:
            print(f"  - {c.point}: {c.reason}")
    cov = [c for c in rows if c.covered]
    met = sum(1 for c in cov if c.within_goal)
    print(f"\ncovered points within the goal (10% on throughput/overlap/memory, 10 points on gain): {met} of {len(cov)}"
          f" ({', '.join(sorted({c.metric for c in cov})) or 'none'})")
    ref = [c for c in rows if not c.covered and c.simulated_source and c.simulated is not None]
    near = sum(1 for c in ref if abs(c.error) <= GOAL[c.metric])
    print(f"reference rows (the paper's simulator, not claimed) within the same bounds: {near} of {len(ref)}")
    print("no held-out MEASURED throughput point has an operating point this model can run: throughput accuracy "
          "is shown only at the fitted point and against the paper's simulator")
    print("worst error per kind over covered points:")
    for k, c in w.items():
        print(f"  {k:<10} {c.error_text:>9}  {c.point}")
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    now, stored = fitted_now(), stored_fit()
    if args.write:
        path = write_constants(now)
    if args.json:
        print(json.dumps({"fitted": now, "stored": stored, "reserve_interval": asdict(fit_reserve())}, indent=1))
        return 0
    print(f"fitted on DeepSeek's measured decode deployment (step time; nothing else is fitted): {now}")
    print(f"stored in data/constants.json:          {stored}")
    if args.write:
        print(f"wrote {path}")
    return 0


def constant_rows(prof: OpProfile) -> list[dict]:
    rows = []
    for name, c in (prof.constants or {}).items():
        rows.append({"name": name, "where": f"op profile {prof.name}", **c})
    for name, c in all_constants().items():
        rows.append({"name": name, "where": "data/constants.json", **c})
    return sorted(rows, key=lambda r: (KIND_ORDER.get(r["kind"], 9), r["where"], r["name"]))


def _short(value) -> str:
    if isinstance(value, list):
        return f"[{len(value)} rows]"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown_table(prof: OpProfile) -> str:
    """The one table of constants (the README embeds this output verbatim)."""
    lines = ["| constant | value | unit | kind | source |", "| --- | --- | --- | --- | --- |"]
    for r in constant_rows(prof):
        src = r["source"].replace("|", "/")
        lines.append(f"| `{r['name']}` | {_short(r['value'])} | {r['unit']} | {r['kind']} | {src} |")
    return "\n".join(lines)


def cmd_constants(args: argparse.Namespace) -> int:
    prof = OpProfile.load(args.op_profile)
    if args.json:
        print(json.dumps(constant_rows(prof), indent=1))
    else:
        print(markdown_table(prof))
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    prof = OpProfile.load(args.source)
    model = ModelSpec.load(args.model or prof.model_name or "deepseek_v32_exp")
    if prof.tables:
        prof.check(model, get_hardware(prof.hardware))
    print(f"profile {prof.name} ({prof.source}): hardware {prof.hardware}, "
          f"{len(prof.constants or {})} constants, {len(prof.tables)} tables"
          + (f", measured at model {prof.model_name}" if prof.model_name else ""))
    if prof.meta:
        print(f"  written by: {prof.meta.get('command')} at commit {str(prof.meta.get('commit'))[:12]} "
              f"(dirty: {prof.meta.get('dirty')})")
    ops = attention_ops(model, 1, 1, 1024) + ffn_ops(model, 1, False, 32) + ffn_ops(model, 1, True, 32) \
        + head_ops(model, 1) + [embed_op(model, 1), resolve_op(model, 1)]
    if model.num_mtp_layers:
        ops += mtp_input_ops(model, 1)
    names = {op.name: op for op in ops}
    for name, t in sorted(prof.tables.items()):
        known = "" if name in names else "  (not an op of the simulator: unused)"
        print(f"  {name:<18} x={t.x_unit:<10} {len(t.x)} points, {t.x[0]:g}..{t.x[-1]:g} -> "
              f"{t.us[0]:.1f}..{t.us[-1]:.1f} us{known}")
    missing = [n for n, op in names.items() if n not in prof.tables and op.kind not in ("dispatch", "combine")]
    if prof.tables and missing:
        how = "the structured model (constants)" if prof.constants else "nothing: simulating them fails"
        print(f"  ops without a table, timed by {how}: {', '.join(missing)}")
    if prof.constants is None and missing:
        raise SimConfigError(f"profile {prof.source}: ops {', '.join(missing)} have no table and the profile has no "
                             f"constants or base; expected full coverage; fix --op-profile")
    return 0
