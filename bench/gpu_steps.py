"""The records of bench/gpu_check.sh (standard library only: it must run when torch does not).

  python3 bench/gpu_steps.py record --out DIR --name NAME --rc RC --seconds S --timeout-s T [--result FILE]
                                    [--junit FILE]
      appends one JSON line to DIR/steps.jsonl: name, status (pass / fail / skip / timeout), seconds,
      timeout_s, rc, the step's result (its JSON file, or the JUnit counts) and the tail of its log
  python3 bench/gpu_steps.py summary --out DIR --steps "name:timeout ..." --budget-s B [--dry-run]
      writes DIR/summary.json (every step's status, the budget arithmetic, the steps with no line)
      and exits 1 when a step has no line, failed or timed out

Status: `timeout` when the step's `timeout` killed it (rc 124, or 137 after the kill signal);
else `skip` when its result says "skipped" (nothing could run here: no CUDA) or, for pytest,
every test was skipped; else `pass` on rc 0 (pytest: 0, with no failures or errors) and `fail`
otherwise.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import xml.etree.ElementTree as ET

TIMEOUT_RCS = (124, 137)
LOG_TAIL_CHARS = 3000


def junit_counts(path: pathlib.Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    bad = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            bad.append(f"{case.get('classname')}::{case.get('name')}")
    counts["failed_tests"] = bad
    return counts


def status_of(rc: int, result, junit: dict | None) -> str:
    if rc in TIMEOUT_RCS:
        return "timeout"
    if junit is not None:
        if junit["failures"] or junit["errors"] or rc not in (0, 5):
            return "fail"
        return "skip" if junit["tests"] == junit["skipped"] else "pass"
    if isinstance(result, dict) and "skipped" in result:
        return "skip"
    return "pass" if rc == 0 else "fail"


def record(a) -> int:
    out = pathlib.Path(a.out)
    result, junit = None, None
    if a.result and pathlib.Path(a.result).exists():
        try:
            result = json.loads(pathlib.Path(a.result).read_text())
        except ValueError as e:            # a step cut while writing: say so, keep the rest
            result = {"unreadable": f"{type(e).__name__}: {e}"}
    if a.junit and pathlib.Path(a.junit).exists():
        try:
            junit = junit_counts(pathlib.Path(a.junit))
        except ET.ParseError as e:
            result = {"unreadable_junit": str(e)}
    log = out / "logs" / f"{a.name}.log"
    tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:] if log.exists() else None
    status = status_of(a.rc, result, junit)
    line = {"name": a.name, "status": status, "seconds": round(a.seconds, 2), "timeout_s": a.timeout_s,
            "rc": a.rc, "result": junit if junit is not None else result,
            "log": f"logs/{a.name}.log", "log_tail": tail if status in ("fail", "timeout") else None}
    with open(out / "steps.jsonl", "a") as fh:
        fh.write(json.dumps(line) + "\n")
    print(f"[gpu_check] step {a.name}: {status} in {a.seconds:.1f} s (limit {a.timeout_s} s, rc {a.rc})", flush=True)
    return 0


def summary(a) -> int:
    out = pathlib.Path(a.out)
    table = [(n, int(t)) for n, t in (item.split(":") for item in a.steps.split())]
    lines = []
    path = out / "steps.jsonl"
    if path.exists():
        for raw in path.read_text().splitlines():
            try:
                lines.append(json.loads(raw))
            except ValueError:
                lines.append({"name": "?", "status": "unreadable line", "raw": raw[:200]})
    got = {d.get("name"): d for d in lines}
    missing = [n for n, _ in table if n not in got]
    steps = [{"name": n, "timeout_s": t, "status": got[n]["status"] if n in got else "no result line",
              "seconds": got[n]["seconds"] if n in got else None} for n, t in table]
    bad = [s["name"] for s in steps if s["status"] in ("fail", "timeout", "no result line")]
    res = {"dry_run": a.dry_run, "budget_s": a.budget_s, "sum_timeouts_s": sum(t for _, t in table),
           "steps": steps, "missing": missing, "failed": bad,
           "seconds_total": round(sum(s["seconds"] or 0 for s in steps), 1)}
    (out / "summary.json").write_text(json.dumps(res, indent=1) + "\n")
    for s in steps:
        print(f"[gpu_check] {s['name']:14s} {s['status']:15s} {s['seconds'] if s['seconds'] is not None else '-':>8} s"
              f"  (limit {s['timeout_s']} s)")
    print(f"[gpu_check] {len(steps) - len(bad)}/{len(steps)} steps without failure; step limits sum to "
          f"{res['sum_timeouts_s']} s of {a.budget_s}; wrote {out / 'summary.json'}", flush=True)
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(prog="bench/gpu_steps.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", required=True)
    r.add_argument("--name", required=True)
    r.add_argument("--rc", type=int, required=True)
    r.add_argument("--seconds", type=float, required=True)
    r.add_argument("--timeout-s", type=int, required=True)
    r.add_argument("--result")
    r.add_argument("--junit")
    s = sub.add_parser("summary")
    s.add_argument("--out", required=True)
    s.add_argument("--steps", required=True, help='"name:timeout_s name:timeout_s ..." in order')
    s.add_argument("--budget-s", type=int, required=True)
    s.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    return record(a) if a.cmd == "record" else summary(a)


if __name__ == "__main__":
    sys.exit(main())
