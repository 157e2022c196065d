"""Flags and output of `python -m sgl_ess.doctor`."""
from __future__ import annotations

import argparse
import json
import sys

from sgl_ess.config import EssConfigError, build_config
from sgl_ess.doctor.finding import FAILING_STATUSES, STATUSES, exit_code
from sgl_ess.doctor.runner import DoctorInputs, run_checks

DESCRIPTION = f"""\
Checks a machine before sgl-ess serves on it: PCIe links of the NVIDIA GPUs (downgraded width or
speed), host memory and RLIMIT_MEMLOCK against the planned host pool, NUMA placement, transparent
huge pages, the ipc:// socket directories, the PD packages (Mooncake, libibverbs, router), and on a
GPU a ~5 s FlashTrans probe (scattered 656-byte rows vs a bulk copy; not yet run on a GPU).

One line per check: status, check, finding, and for warn/fail the fix.
Statuses: {', '.join(STATUSES)}. Exit code 1 when any check is {' or '.join(FAILING_STATUSES)},
0 otherwise (ok, info, skip and warn do not fail the run); 2 for bad flags or a bad config.
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sgl_ess.doctor", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true",
                   help="print a JSON list of {check, status, detail, fix} instead of lines")
    pool = p.add_argument_group("the planned host pool (as the launcher sizes it)")
    pool.add_argument("--ess-memory-pool-size-gb", "--pool-gb", dest="pool_gb", type=float, default=None,
                      metavar="GB", help="host-pool budget in GB (1e9 B), as given to the launcher; also read "
                                         "from --ess-config and SGLESS_MEMORY_POOL_SIZE_GB. Unset: the launcher's "
                                         "GPU default, MemAvailable minus the safety margin")
    pool.add_argument("--ess-config", metavar="FILE", help="the launcher's YAML file (ess_config.memory_pool_size_gb)")
    pool.add_argument("--pool-bytes", type=int, metavar="N",
                      help="host-pool bytes exactly (e.g. host_bytes from /ess/status); overrides the GB budget")
    pool.add_argument("--ess-lock-host-memory", dest="lock_pool", action="store_true",
                      help="the server will mlock the pool (--ess-lock-host-memory; also read from "
                           "--ess-config and SGLESS_LOCK_HOST_MEMORY): check RLIMIT_MEMLOCK against the pool's bytes")
    pool.add_argument("--lock-bytes", type=int, default=0, metavar="N",
                      help="check RLIMIT_MEMLOCK against N bytes to lock (overrides --ess-lock-host-memory)")
    p.add_argument("--under-load", action="store_true",
                   help="the GPUs are busy now (serving, a benchmark): a PCIe link-speed drop is a fail, not a "
                        "warn (idle GPUs may lower link speed to save power)")
    p.add_argument("--no-probe", action="store_true", help="skip the GPU FlashTrans probe")
    p.add_argument("--probe-seconds", type=float, default=5.0, metavar="S",
                   help="time budget of the GPU probe (default 5; Triton's first compile comes on top)")
    roots = p.add_argument_group("where to read the machine from (tests use fake trees)")
    roots.add_argument("--sysfs-root", default="/sys", metavar="DIR", help="sysfs (default /sys)")
    roots.add_argument("--proc-root", default="/proc", metavar="DIR",
                       help="procfs (default /proc): meminfo, self/status, self/numa_maps")
    roots.add_argument("--dev-root", default="/dev", metavar="DIR", help="device nodes (default /dev): nvidia<N>")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        cfg = build_config(args.ess_config, {"memory_pool_size_gb": args.pool_gb,
                                             "lock_host_memory": True if args.lock_pool else None})
    except EssConfigError as e:
        p.error(str(e))
    inp = DoctorInputs(sys_root=args.sysfs_root, proc_root=args.proc_root, dev_root=args.dev_root,
                       pool_bytes=args.pool_bytes, pool_gb=cfg.memory_pool_size_gb,
                       lock_pool=cfg.lock_host_memory, lock_bytes=args.lock_bytes, under_load=args.under_load,
                       probe=not args.no_probe, probe_seconds=args.probe_seconds)
    findings = run_checks(inp)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=1))
    else:
        for f in findings:
            print(f.line())
        fails = sum(f.status in FAILING_STATUSES for f in findings)
        warns = sum(f.status == "warn" for f in findings)
        print(f"{len(findings)} checks: {fails} fail, {warns} warn", file=sys.stderr)
    return exit_code(findings)
