"""Decode throughput against a TPOT target (--ess-slo-tpot-ms), side by side in one run.

    python -m bench slo [--running 24] [--output-len 96] [--rounds 2] [--fractions 0.8,0.6,0.4] [--plot FILE.png]

One server per setting, run one after the other on the same machine: first without a target
(SGLang's own batching), which measures the unconstrained inter-token latency U at full batch; then
one per fraction f with target f x U. Each run drives a steady load twice (bench/steady_load.py:
`--running` clients, each streaming `--rounds` greedy requests of 2/3 to 4/3 x `--output-len`
tokens back to back; the first pass lets the cap settle) and reports, over the middle half of the
second pass: median and p90 inter-token latency, output tokens per second of the whole pass, and the
controller's final cap and number of cap changes. What it measures: the latency/throughput trade the controller makes
on this machine's decode step (a speed effect of batching, not of ESS). Results:
bench/results/slo.json (command, commit, versions) and a plot with --plot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.meta import write_result  # noqa: E402
from bench import steady_load  # noqa: E402
from bench.serving_suite import ADMIN, start_server, stop_server  # noqa: E402


def _pass(base: str, prompts: list[str], a) -> dict:
    arrivals, t0, t1 = steady_load.run(base, ADMIN, prompts, a.output_len, a.rounds)
    gaps = steady_load.steady_gaps_ms(arrivals, t0, t1)
    tokens = sum(len(ts) for ts in arrivals)
    return {"itl_p50_ms": statistics.median(gaps) if gaps else None,
            "itl_p90_ms": gaps[int(0.9 * (len(gaps) - 1))] if gaps else None,
            "output_tok_per_s": tokens / (t1 - t0), "seconds": t1 - t0, "steady_gaps": len(gaps)}


def _run(label: str, extra: list[str], a, prompts: list[str]) -> dict:
    log = f"/tmp/sgl_ess_bench_slo_{label}.log"
    proc, base = start_server(["--max-running-requests", str(a.running), *extra], log)
    try:
        _pass(base, prompts, a)                             # warm-up; with a target: the cap settles
        res = _pass(base, prompts, a)
        with urllib.request.urlopen(urllib.request.Request(base + "/ess/status", headers=ADMIN), timeout=60) as r:
            res["slo"] = json.loads(r.read())["schedulers"][0].get("slo")
    finally:
        stop_server(proc)
    print(f"  {label:>10}: ITL p50 {res['itl_p50_ms']:.1f} ms, p90 {res['itl_p90_ms']:.1f} ms, "
          f"{res['output_tok_per_s']:.1f} tok/s, controller {res['slo']}", flush=True)
    return res


def _plot(path: str, rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["itl_p50_ms"] for r in rows]
    ys = [r["output_tok_per_s"] for r in rows]
    ax.plot(xs, ys, "o-")
    for r in rows:
        ax.annotate(r["label"], (r["itl_p50_ms"], r["output_tok_per_s"]), fontsize=8)
    ax.set_xlabel("steady-state ITL p50 (ms)")
    ax.set_ylabel("output tokens / s")
    ax.set_title("decode throughput vs TPOT target (embedded model, CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench slo", description=__doc__.split("\n\n")[0])
    p.add_argument("--running", type=int, default=24, help="concurrent requests = --max-running-requests")
    p.add_argument("--output-len", type=int, default=96, help="mean greedy tokens per request (2/3 .. 4/3 of it)")
    p.add_argument("--rounds", type=int, default=2, help="requests each client sends back to back per pass")
    p.add_argument("--fractions", default="0.8,0.6,0.4", help="targets as fractions of the unconstrained ITL")
    p.add_argument("--plot", default="", help="write a throughput-vs-ITL plot (PNG) here")
    a = p.parse_args()
    for flag, v in (("--running", a.running), ("--output-len", a.output_len), ("--rounds", a.rounds)):
        if v < 1:
            p.error(f"{flag} {v}: expected at least 1")
    fractions = [float(x) for x in a.fractions.split(",") if x]
    prompts = [" ".join(f"b{i}q{j % 23}" for j in range(40 + 7 * i)) for i in range(a.running)]
    print(f"SLO bench: {a.running} clients x {a.rounds} requests of ~{a.output_len} tokens; "
          f"targets {fractions} x unconstrained", flush=True)
    rows = [dict(label="no target", target_ms=None, **_run("none", [], a, prompts))]
    u = rows[0]["itl_p50_ms"]
    for f in fractions:
        t = round(u * f, 1)
        rows.append(dict(label=f"{f:g} x U", target_ms=t, **_run(f"f{f:g}", ["--ess-slo-tpot-ms", str(t)], a, prompts)))
    print("\n| target | ITL p50 ms | ITL p90 ms | tok/s | tok/s vs no target | final cap | cap changes |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        slo = r.get("slo") or {}
        print(f"| {r['target_ms'] or 'none'} | {r['itl_p50_ms']:.1f} | {r['itl_p90_ms']:.1f} | "
              f"{r['output_tok_per_s']:.1f} | {r['output_tok_per_s'] / rows[0]['output_tok_per_s']:.2f} | "
              f"{slo.get('cap', a.running)} | {slo.get('changes', 0)} |")
    # the result first: its metadata records whether the tree is clean, and the plot is a new file in it
    path = write_result("slo", {"command": " ".join(["python -m bench slo", *sys.argv[1:]]), "running": a.running,
                                "output_len": a.output_len, "rounds": a.rounds, "unconstrained_itl_ms": u,
                                "rows": rows, "plot": a.plot or None})
    print(f"results: {path}")
    if a.plot:
        _plot(a.plot, rows)
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
