"""PD vs colocated, side by side, with SGLang's own ``bench_serving`` through SGLang's router.

One command::

    .venv/bin/python -m bench pd [--num-prompts 16] [--input-len 512] [--output-len 64] [--repeats 3]

Two deployments, up together and measured in interleaved rounds:
  pd         ``python -m sgl_ess.launch_pd``: a prefill server and one ESS decode server (ESS on both:
             the warm state travels with the KV) behind the router; bench_serving talks to the router.
  colocated  one ESS server with the same flags as the decode node.
Equal decode device bytes: the decode node and the colocated server run the same flags (hot buffers,
staging, index keys, pool size), and their startup memory reports are recorded side by side. The PD
deployment has a second server (the prefill) beside it; on this 2-core machine all its processes share
the same two cores with the router, so this measures what the split costs and changes (TTFT: the KV
transfer and the router hop; TPOT: decode no longer interrupted by prefills) on one machine, not a
production speed-up. Reports TTFT, TPOT/ITL and output tokens/s per deployment and PD/colocated ratios,
and the ESS decode node's warm starts and misses. Dataset ``random-ids`` (no download). Result:
``bench/results/pd.json`` with commands, commit and versions.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.meta import write_result  # noqa: E402
from bench.serving_suite import ADMIN_KEY, REPO, bench, flush, get_json, median_run, start_server, stop_server  # noqa: E402


def start_pd(server_args: list[str], tmp: str) -> tuple[subprocess.Popen, dict]:
    lo = random.randrange(40000, 60000, 1000)
    out = open(os.path.join(tmp, "launch_pd.out"), "w")
    cmd = [sys.executable, "-m", "sgl_ess.launch_pd", "--ports", f"{lo}-{lo + 999}", "--log-dir",
           os.path.join(tmp, "pd_logs"), "--", *server_args, "--admin-api-key", ADMIN_KEY]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 1200
    while "ready:" not in open(out.name).read():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"launch_pd rc={proc.poll()}: {open(out.name).read()[-3000:]}")
        time.sleep(1.0)
    urls = {"router": f"http://127.0.0.1:{lo}", "prefill": f"http://127.0.0.1:{lo + 2}",
            "decode": f"http://127.0.0.1:{lo + 4}", "command": cmd}
    return proc, urls


def stop_pd(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _run(base: str, a, path: str, flush_bases: list[str]) -> dict:
    for b in flush_bases:
        flush(b)
    cmd, res = bench(base, "sglang", a, path)
    return {"bench_command": cmd, "output_throughput_tok_s": res.get("output_throughput"),
            "completed": res.get("completed"), "mean_ttft_ms": res.get("mean_ttft_ms"),
            "median_ttft_ms": res.get("median_ttft_ms"), "mean_tpot_ms": res.get("mean_tpot_ms"),
            "mean_itl_ms": res.get("mean_itl_ms"), "duration_s": res.get("duration")}


def _ratio(x, y):
    return None if not x or not y else x / y


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--hot-slots", type=int, default=48, help="hot slots per request per layer (every server)")
    p.add_argument("--max-running", type=int, default=16, help="--max-running-requests (every server)")
    p.add_argument("--repeats", type=int, default=3, help="measured runs per deployment; the median-throughput "
                   "run is reported with every run's throughput (default 3)")
    p.add_argument("--warmup-prompts", type=int, default=4)
    a = p.parse_args()
    server_args = ["--ess-hot-slots-per-request", str(a.hot_slots), "--max-running-requests", str(a.max_running)]
    tmp = tempfile.mkdtemp(prefix="sgl_ess_bench_pd_")
    print(f"[bench pd] logs in {tmp}", flush=True)
    pd_proc, urls = start_pd(server_args, tmp)
    colo_proc = None
    try:
        colo_proc, colo = start_server(server_args, os.path.join(tmp, "colocated.log"))
        warm = argparse.Namespace(**{**vars(a), "num_prompts": a.warmup_prompts, "seed": 2})
        bench(urls["router"], "sglang", warm, os.path.join(tmp, "pd_warm.jsonl"))
        bench(colo, "sglang", warm, os.path.join(tmp, "colo_warm.jsonl"))
        memory = {"pd_decode": get_json(urls["decode"], "/ess/status").get("memory"),
                  "colocated": get_json(colo, "/ess/status").get("memory")}
        before = get_json(urls["decode"], "/ess/status")["schedulers"][0]
        runs = {"pd": [], "colocated": []}
        for rep in range(a.repeats):
            print(f"[bench pd] round {rep + 1}/{a.repeats}", flush=True)
            runs["pd"].append(_run(urls["router"], a, os.path.join(tmp, f"pd_{rep}.jsonl"),
                                   [urls["prefill"], urls["decode"]]))
            runs["colocated"].append(_run(colo, a, os.path.join(tmp, f"colo_{rep}.jsonl"), [colo]))
        after = get_json(urls["decode"], "/ess/status")["schedulers"][0]
    finally:
        stop_pd(pd_proc)
        if colo_proc is not None:
            stop_server(colo_proc)
    med = {k: median_run(v) for k, v in runs.items()}
    ratios = {f"pd_over_colocated_{m}": _ratio(med["pd"][m], med["colocated"][m])
              for m in ("output_throughput_tok_s", "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms")}
    decode = {k: after.get(k, 0) - before.get(k, 0) for k in ("pd_warm_starts", "cold_starts", "pd_warm_rejected",
                                                                "warmup_rows", "rows_h2d")}
    payload = {"what": "PD (prefill + 1 ESS decode behind smg) vs one colocated ESS server, same server flags, "
                       "bench_serving random-ids, request rate inf; all processes share this machine's cores",
               "args": vars(a), "server_args": server_args, "launch_pd_command": urls["command"],
               "pd": med["pd"], "colocated": med["colocated"], "ratios": ratios,
               "pd_decode_node_during_runs": decode, "memory_reports": memory}
    path = write_result("pd", payload)
    print(json.dumps({"ratios": ratios, "pd_decode_node": decode,
                      "pd": {k: med["pd"][k] for k in ("output_throughput_tok_s", "mean_ttft_ms", "mean_tpot_ms")},
                      "colocated": {k: med["colocated"][k] for k in ("output_throughput_tok_s", "mean_ttft_ms",
                                                                     "mean_tpot_ms")}}, indent=1))
    print(f"[bench pd] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
