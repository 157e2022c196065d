"""Command line: `python -m sgl_ess.sim [run|plan|validate|fit|constants|profile|sweep|sensitivity|v4] ...`.

Flags are generated from the dataclass fields of config.py (name, type, default, help, choices); `plan`
also gets ServingLayoutConfig's. Fields in LIST_FIELDS accept comma lists on `run` and `sweep`. Every
SimConfigError exits with status 2 and one line on stderr; no traceback.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import MISSING, fields

from .config import (DeploymentConfig, OffloadConfig, ServingLayoutConfig, SimConfig, SimConfigError, WorkloadConfig,
                     flag_of)
from .hardware import known_hardware

GROUPS = (("deployment", DeploymentConfig), ("workload", WorkloadConfig), ("ess", OffloadConfig))
LAYOUT_GROUP = (("serving layout (host pools per node)", ServingLayoutConfig),)
LIST_FIELDS = ("context_tokens", "mtp", "accept", "batch", "ratio")
HEADLINE = {"batch": "52,160", "ratio": "1.0,0.21"}


def _parse_scalar(type_str: str, text: str, flag_name: str):
    base = type_str.replace(" | None", "").strip()
    if text.lower() in ("none", "") and "None" in type_str:
        return None
    try:
        if base == "int":
            mult = 1
            if text[-1:] in ("k", "K"):          # 32k = 32768 tokens
                text, mult = text[:-1], 1024
            val = float(text) * mult
            if val != int(val):
                raise ValueError
            return int(val)
        if base == "float":
            return float(text)
    except ValueError:
        raise SimConfigError(f"{flag_name} {text!r}: expected {'an integer' if base == 'int' else 'a number'}") \
            from None
    return text


def _is_bool(f) -> bool:
    return f.type in ("bool", "bool | None")


def add_config_args(p: argparse.ArgumentParser, lists: bool, exclude: tuple[str, ...] = (), groups=GROUPS) -> None:
    for title, cls in groups:
        g = p.add_argument_group(title)
        for f in fields(cls):
            if f.name in exclude:
                continue
            name = flag_of(cls, f.name)
            default = f.default if f.default is not MISSING else None
            help_ = f.metadata.get("help", "")
            if "(default:" not in help_:
                help_ += f" (default: {default})"
            choices = f.metadata.get("choices")
            if _is_bool(f):
                g.add_argument(name, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=help_)
            elif choices:
                g.add_argument(name, dest=f.name, default=None, choices=choices, help=help_)
            else:
                many = lists and f.name in LIST_FIELDS
                g.add_argument(name, dest=f.name, default=None, metavar="LIST" if many else f.name.upper(),
                               help=help_ + (" ; comma list allowed" if many else ""))


def _values(args, cls, name: str, lists: bool) -> list:
    f = next(x for x in fields(cls) if x.name == name)
    raw = getattr(args, name, None)
    if raw is None or _is_bool(f):
        return [f.default if raw is None else raw]
    parts = raw.split(",") if lists and name in LIST_FIELDS else [raw]
    return [_parse_scalar(f.type, s.strip(), flag_of(cls, name)) for s in parts]


def build_group(args, cls):
    """One config group (no lists) from parsed args; unset flags keep the field defaults."""
    return cls(**{f.name: _values(args, cls, f.name, False)[0] for f in fields(cls)})


def build_configs(args, lists: bool) -> list[SimConfig]:
    """Cartesian product over context/mtp/accept; batch and ratio lists pair up (or broadcast)."""
    deploy = build_group(args, DeploymentConfig)
    ess_base = {f.name: _values(args, OffloadConfig, f.name, False)[0] for f in fields(OffloadConfig)
                if f.name != "ratio"}
    batches = _values(args, WorkloadConfig, "batch", lists)
    ratios = _values(args, OffloadConfig, "ratio", lists)
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
                                  OffloadConfig(ratio=r, **ess_base)))
    return cfgs


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (exit 2) that points at --help."""

    def error(self, message: str):
        self.exit(2, f"error: {message}; see {self.prog} --help\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m sgl_ess.sim",
        description="ESS decode performance simulator and capacity planner (DeepSeek-V3.2-Exp, DP attention + "
                    "EP). Operator times come from an op profile (--op-profile; default: H200 built from published "
                    "DeepGEMM / FlashMLA / DeepEP figures). With no arguments: the paper's headline (32K, MTP 2, "
                    f"accept 1.7, batch 52 r=1.0 vs batch 160 r=0.21). Known hardware: {', '.join(known_hardware())}.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    run = sub.add_parser("run", help="simulate operating points and print a table (or --json rows)")
    add_config_args(run, lists=True)
    run.add_argument("--json", action="store_true", help="print one JSON object per row")
    run.add_argument("--no-fit-check", action="store_true",
                     help="simulate batches that do not fit in GPU memory (like the paper's Figure 1)")
    pl = sub.add_parser("plan", help="capacity question: batch, hot buffer, host pool, tokens/s, binding resource",
                        description="Answer a capacity question for a deployment: the largest batch that fits GPU "
                                    "and host memory and meets the TPOT SLO, the best sparse memory ratio and "
                                    "overlap, the hot-buffer and host-pool sizes, expected tokens/s, and which "
                                    "resource binds; then the host pools per node for an SGLang layout (--tp, "
                                    "--dp, --enable-dp-attention or --attn-dp-size, --nnodes), shared and per rank. Prints its "
                                    "assumptions with the answer.")
    add_config_args(pl, lists=False, exclude=("batch", "ratio"))
    add_config_args(pl, lists=False, groups=LAYOUT_GROUP)
    pl.add_argument("--gpus", default=None, help="total GPUs, as N or NxGPU (8xH200 = 8 GPUs of --hardware h200); "
                                                 "sets --nodes = N / --gpus-per-node and, unless given, --ep = N")
    pl.add_argument("--slo-tpot-ms", "--slo-ms", dest="slo_tpot_ms", type=float, default=None,
                    help="max time per output token in ms")
    pl.add_argument("--host-gb", dest="host_mem_gb", default=None, help="same as --host-mem-gb (host memory per node)")
    pl.add_argument("--plot", default=None, help="write tokens/s vs batch (ESS on and off, limits marked) to this PNG")
    pl.add_argument("--ratios", default=None, help="sparse memory ratios to consider (comma list; default "
                                                   "0.1,0.15,0.21,0.3,0.4,0.5,0.6,0.8,1.0)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON")
    va = sub.add_parser("validate", help="error on every published point not used for fitting (the protocol)")
    va.add_argument("--op-profile", default=None, help="op profile to validate (default: h200_published)")
    va.add_argument("--json", action="store_true", help="print as JSON")
    fi = sub.add_parser("fit", help="refit the two constants on the first Table 2 row (and nothing else)")
    fi.add_argument("--write", action="store_true", help="store the result in sgl_ess/sim/data/constants.json")
    fi.add_argument("--json", action="store_true", help="print as JSON")
    co = sub.add_parser("constants", help="every constant (op profile + simulator), its kind and its source")
    co.add_argument("--op-profile", default=None, help="op profile whose constants to list (default: h200_published)")
    co.add_argument("--json", action="store_true", help="print as JSON")
    pr = sub.add_parser("profile", help="load and check an op profile; summarize its tables and constants")
    pr.add_argument("source", help="profile file, or the name of a shipped profile (h200_published)")
    pr.add_argument("--model", default=None, help="check the tables against this model's shapes "
                                                  "(default: the profile's own)")
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
    v4 = sub.add_parser("v4", help="DeepSeek-V4 capacity: cache bytes per request resident vs ESS, largest batch",
                        description="DeepSeek-V4 (window + C4 + C128 compressed attention) memory only: GPU bytes "
                                    "per request by part, SGLang's resident cache vs ESS (C4 entries on the host, "
                                    "a hot buffer of them on the GPU), host bytes per token, and the largest "
                                    "decode batch per GPU each way. V4's step time is not modelled.")
    v4.add_argument("--model", default="deepseek_v4_flash", help="V4 model data (default: deepseek_v4_flash)")
    v4.add_argument("--context", default="32k,128k", help="context tokens per request, comma list (32k = 32768)")
    v4.add_argument("--ratio", type=float, default=0.21,
                    help="ESS hot buffer as a fraction of a request's C4 entries, at least the 512 of one top-k "
                         "(default: 0.21, the paper's)")
    v4.add_argument("--hardware", default="h200", help=f"GPU profile ({', '.join(known_hardware())})")
    v4.add_argument("--gpu-mem-gb", type=float, default=None, help="override the GPU memory in GB")
    v4.add_argument("--ep", type=int, default=8, help="GPUs the routed experts are sharded over (default: 8)")
    v4.add_argument("--gpus-per-node", type=int, default=8, help="GPUs sharing a node's host memory (default: 8)")
    v4.add_argument("--host-mem-gb", type=float, default=None,
                    help="host memory per node for the C4 entries (default: unlimited; the need is printed)")
    v4.add_argument("--json", action="store_true", help="print one JSON object per context")
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
        if args.cmd in ("validate", "fit", "constants", "profile"):
            from . import reports
            return getattr(reports, "cmd_" + args.cmd)(args)
        if args.cmd == "v4":
            from .dsv4_report import cmd_v4
            return cmd_v4(args)
        return getattr(commands, "cmd_" + args.cmd)(args)
    except SimConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def print_json_rows(rows) -> None:
    for r in rows:
        print(json.dumps(r, sort_keys=False))
