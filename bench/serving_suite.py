"""ESS off vs ESS on, side by side, with SGLang's own ``bench_serving``.

One command::

    .venv/bin/python bench/serving_suite.py [--num-prompts 32] [--input-len 512] [--output-len 64]

For each mode it starts ``python -m sgl_ess.launch_server`` (embedded tiny DeepSeek-V3.2,
127.0.0.1, a free port) with the SAME device latent budget:
  ESS off  --max-total-tokens BUDGET          (every latent in SGLang's device pool)
  ESS on   hot buffers MAX_RUNNING x HOT_SLOTS = BUDGET, history in the host pool
then runs ``python -m sglang.bench_serving --backend sglang`` (and, for the OpenAI backend,
a short ``--backend sglang-oai`` pass), stops the server, and writes one JSON file to
``bench/results/serving_<UTC time>.json`` with the commands, git commit, versions, and per
mode: output tokens/s, average concurrency (bench_serving's figure), peak concurrency (polled
from the server's ``#running-req``), completed requests. The servers run one after the other
so they do not share the CPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.meta import write_result  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = os.path.join(REPO, "sgl_ess", "models", "tiny_dsv32")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sgl_ess.launch_server", "--port", str(port), *args]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited rc={proc.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise TimeoutError(f"server not healthy in 300 s; see {log_path}")


def stop_server(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
            time.sleep(1)
        except subprocess.TimeoutExpired:
            continue


class PeakRunning:
    """Polls the server log for SGLang's '#running-req: N' decode lines; keeps the maximum."""

    def __init__(self, log_path: str):
        self.log_path = log_path
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._scan()

    def _scan(self):
        with open(self.log_path, errors="replace") as fh:
            for m in re.finditer(r"#running-req: (\d+)", fh.read()):
                self.peak = max(self.peak, int(m.group(1)))

    def _run(self):
        while not self._stop.wait(1.0):
            self._scan()


def bench(base: str, backend: str, a, out_file: str) -> tuple[list[str], dict]:
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--base-url", base,
           "--model", MODEL, "--tokenizer", MODEL, "--dataset-name", "random-ids",
           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--random-range-ratio", "1.0", "--num-prompts", str(a.num_prompts), "--request-rate", "inf",
           "--seed", "1", "--disable-tqdm", "--output-file", out_file]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"bench_serving failed rc={r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(out_file) as fh:
        lines = [json.loads(x) for x in fh if x.strip()]
    return cmd, lines[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--hot-slots", type=int, default=48, help="ESS on: hot slots per request per layer")
    p.add_argument("--max-running", type=int, default=32, help="--max-running-requests for both servers")
    p.add_argument("--oai-prompts", type=int, default=4, help="prompts for the OpenAI-backend pass (0 = skip)")
    a = p.parse_args()
    budget = a.hot_slots * a.max_running
    common = ["--max-running-requests", str(a.max_running), "--decode-log-interval", "1"]
    modes = {
        "ess_off": ["--ess-enabled", "false", "--max-total-tokens", str(budget), *common],
        "ess_on": ["--ess-hot-slots-per-request", str(a.hot_slots), *common,
                   "--max-total-tokens", str(max(65536, 2 * a.num_prompts * (a.input_len + a.output_len)))],
    }
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report = {"suite": "serving", "device_latent_budget_tokens_per_layer": budget, "workload": vars(a),
              "modes": {}}
    tmp = tempfile.mkdtemp(prefix="sgl_ess_bench_")
    for name, args in modes.items():
        log = os.path.join(tmp, f"{name}.log")
        proc, base = start_server(args, log)
        try:
            with PeakRunning(log) as peak:
                cmd, res = bench(base, "sglang", a, os.path.join(tmp, f"{name}.jsonl"))
            entry = {"server_args": args, "bench_command": cmd,
                     "output_throughput_tok_s": res.get("output_throughput"),
                     "avg_concurrency": res.get("concurrency"), "peak_running_requests": peak.peak,
                     "completed": res.get("completed"), "num_prompts": a.num_prompts,
                     "mean_ttft_ms": res.get("mean_ttft_ms"), "mean_itl_ms": res.get("mean_itl_ms"),
                     "duration_s": res.get("duration")}
            if a.oai_prompts:
                b = argparse.Namespace(**{**vars(a), "num_prompts": a.oai_prompts})
                oai_cmd, oai = bench(base, "sglang-oai", b, os.path.join(tmp, f"{name}_oai.jsonl"))
                entry["openai_backend"] = {"command": oai_cmd, "completed": oai.get("completed"),
                                           "output_throughput_tok_s": oai.get("output_throughput")}
            report["modes"][name] = entry
        finally:
            stop_server(proc)
    on, off = report["modes"]["ess_on"], report["modes"]["ess_off"]
    report["ratios_on_over_off"] = {
        "output_throughput": on["output_throughput_tok_s"] / off["output_throughput_tok_s"],
        "peak_running_requests": on["peak_running_requests"] / max(1, off["peak_running_requests"]),
        "avg_concurrency": on["avg_concurrency"] / off["avg_concurrency"],
    }
    out = write_result(f"serving_{stamp}", report)
    print(f"{'mode':8} {'out tok/s':>10} {'avg conc':>9} {'peak run':>9} {'completed':>10}")
    for name, e in report["modes"].items():
        print(f"{name:8} {e['output_throughput_tok_s']:>10.1f} {e['avg_concurrency']:>9.2f} "
              f"{e['peak_running_requests']:>9} {e['completed']:>6}/{e['num_prompts']}")
    r = report["ratios_on_over_off"]
    print(f"ESS on / off: output tok/s {r['output_throughput']:.2f}x, peak running {r['peak_running_requests']:.2f}x, "
          f"avg concurrency {r['avg_concurrency']:.2f}x (same device latent budget: {budget} rows per layer)")
    print("wrote", out)


if __name__ == "__main__":
    main()
