"""Command line: `python -m sgl_ess.sim [run|plan|sweep|sensitivity|calibrate] ...`.

Flags are generated from the dataclass fields of config.py (name, type, default, help). Fields in
LIST_FIELDS accept comma lists on `run` and `sweep`. Every SimConfigError exits with status 2 and one
line on stderr; no traceback.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import MISSING, fields

from .config import DeploymentConfig, EssConfig, SimConfig, SimConfigError, WorkloadConfig, flag_of
from .hardware import known_hardware

GROUPS = (("deployment", DeploymentConfig), ("workload", WorkloadConfig), ("ess", EssConfig))
LIST_FIELDS = ("context_tokens", "mtp", "accept", "batch", "ratio")
HEADLINE = {"batch": "52,160", "ratio": "1.0,0.21"}


def _parse_scalar(type_str: str, text: str, flag_name: str):
    base = type_str.replace(" | None", "").strip()
    if text.lower() in ("none", "") and "None" in type_str:
        return None
    try:
        if base == "int":
            val = float(text)
            if val != int(val):
                raise ValueError
            return int(val)
        if base == "float":
            return float(text)
    except ValueError:
        raise SimConfigError(f"{flag_name} {text!r}: expected {'an integer' if base == 'int' else 'a number'}") \
            from None
    return text


def add_config_args(p: argparse.ArgumentParser, lists: bool, exclude: tuple[str, ...] = ()) -> None:
    for title, cls in GROUPS:
        g = p.add_argument_group(title)
        for f in fields(cls):
            if f.name in exclude:
                continue
            name = flag_of(cls, f.name)
            default = f.default if f.default is not MISSING else None
            help_ = f.metadata.get("help", "") + f" (default: {default})"
            if f.type == "bool":
                g.add_argument(name, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=help_)
            else:
                many = lists and f.name in LIST_FIELDS
                g.add_argument(name, dest=f.name, default=None, metavar="LIST" if many else f.name.upper(),
                               help=help_ + (" ; comma list allowed" if many else ""))


def _values(args, cls, name: str, lists: bool) -> list:
    f = next(x for x in fields(cls) if x.name == name)
    raw = getattr(args, name, None)
    if raw is None or f.type == "bool":
        return [f.default if raw is None else raw]
    parts = raw.split(",") if lists and name in LIST_FIELDS else [raw]
    return [_parse_scalar(f.type, s.strip(), flag_of(cls, name)) for s in parts]


def build_configs(args, lists: bool) -> list[SimConfig]:
    """Cartesian product over context/mtp/accept; batch and ratio lists pair up (or broadcast)."""
    deploy = DeploymentConfig(**{f.name: _values(args, DeploymentConfig, f.name, False)[0]
                                 for f in fields(DeploymentConfig)})
    ess_base = {f.name: _values(args, EssConfig, f.name, False)[0] for f in fields(EssConfig) if f.name != "ratio"}
    batches = _values(args, WorkloadConfig, "batch", lists)
    ratios = _values(args, EssConfig, "ratio", lists)
    if len(batches) != len(ratios) and 1 not in (len(batches), len(ratios)):
        raise SimConfigError(f"--batch has {len(batches)} values and --ratio {len(ratios)}: expected equal "
                             f"lengths (paired) or one of them a single value")
    n = max(len(batches), len(ratios))
    pairs = [(batches[i if len(batches) > 1 else 0], ratios[i if len(ratios) > 1 else 0]) for i in range(n)]
    out_tokens = _values(args, WorkloadConfig, "output_tokens", False)[0]
    cfgs = []
    for ctx, mtp, acc in itertools.product(_values(args, WorkloadConfig, "context_tokens", lists),
                                           _values(args, WorkloadConfig, "mtp", lists),
                                           _values(args, WorkloadConfig, "accept", lists)):
        for b, r in pairs:
            cfgs.append(SimConfig(deploy, WorkloadConfig(context_tokens=ctx, mtp=mtp, accept=acc, batch=b,
                                                         output_tokens=out_tokens),
                                  EssConfig(ratio=r, **ess_base)))
    return cfgs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sgl_ess.sim",
        description="ESS decode performance simulator and capacity planner (DeepSeek-V3.2-Exp, DP attention + "
                    "EP). With no arguments: the paper's headline (32K, MTP 2, accept 1.7, batch 52 r=1.0 vs "
                    f"batch 160 r=0.21). Known hardware: {', '.join(known_hardware())}.")
    sub = p.add_subparsers(dest="cmd")
    run = sub.add_parser("run", help="simulate operating points and print a table (or --json rows)")
    add_config_args(run, lists=True)
    run.add_argument("--json", action="store_true", help="print one JSON object per row")
    run.add_argument("--no-fit-check", action="store_true",
                     help="simulate batches that do not fit in GPU memory (like the paper's Figure 1)")
    run.add_argument("--op-profile", default=None, help="JSON of measured op times replacing the roofline")
    pl = sub.add_parser("plan", help="best batch, ratio and overlap strategy, and the gain over no offload")
    add_config_args(pl, lists=False, exclude=("batch", "ratio"))
    pl.add_argument("--gpus", type=int, default=None, help="total GPUs (sets --nodes = gpus / --gpus-per-node)")
    pl.add_argument("--slo-tpot-ms", type=float, default=None, help="max time per output token in ms")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    sw = sub.add_parser("sweep", help="throughput vs batch with/without ESS and misses vs ratio (--plot PNG)")
    add_config_args(sw, lists=False, exclude=("batch",))
    sw.add_argument("--batches", default="16,32,52,64,96,128,160,192,256,320", help="batches to sweep")
    sw.add_argument("--ratios", default="0.1,0.15,0.21,0.3,0.4,0.5,0.7,0.9", help="ratios for misses vs ratio")
    sw.add_argument("--ess-ratio", type=float, default=0.21, help="ratio of the ESS throughput curve")
    sw.add_argument("--plot", default=None, help="write the figure to this PNG path")
    sw.add_argument("--json", action="store_true", help="print the sweep as JSON")
    se = sub.add_parser("sensitivity", help="how the predicted gain moves with PCIe rate, hit rate and overlap")
    add_config_args(se, lists=False)
    se.add_argument("--baseline-batch", type=int, default=52, help="no-offload batch the gain is measured against")
    se.add_argument("--json", action="store_true", help="print rows as JSON")
    ca = sub.add_parser("calibrate", help="refit the tuned constants on the calibration rows; compare with paper")
    ca.add_argument("--json", action="store_true", help="print as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from . import commands
        if not argv:
            return commands.headline()
        args = parser().parse_args(argv)
        if args.cmd is None:
            return commands.headline()
        return getattr(commands, "cmd_" + args.cmd)(args)
    except SimConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def print_json_rows(rows) -> None:
    for r in rows:
        print(json.dumps(r, sort_keys=False))
