"""ESS off vs ESS on, side by side, with SGLang's own ``bench_serving``, at EQUAL DEVICE BYTES.

One command::

    .venv/bin/python bench/serving_suite.py [--num-prompts 32] [--input-len 512] [--output-len 64]

Like with like (issue 7): both servers get the same device memory for the KV side, counted the way
each really spends it (the servers' own startup reports, ``/ess/status`` "memory"):
  ESS on   hot buffers + staging + index keys for EVERY token of the host pool (the indexer scores
           all tokens, so its keys stay on the device) -- the latent history itself is in host memory;
  ESS off  latents + index keys for every token of SGLang's device pool.
ESS on runs first with a host pool that holds the whole workload; its device bytes fix the ESS-off
pool: tokens = device bytes / (layers x (latent row + index key row)). Model weights and the
req_to_token map are the same in both and are reported, not counted.

Per mode: a warm-up pass (other prompts, then /flush_cache), then the measured
``python -m sglang.bench_serving --backend sglang`` ``--repeats`` times (each after /flush_cache;
the median-throughput run is reported, with every run's throughput), and a short
``--backend sglang-oai`` pass.
Dataset: ``random-ids`` -- generated token ids, no download; bench_serving runs with
HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1, so it works on a machine without network. Results:
``bench/results/serving_<UTC time>.json`` with commands, commit, versions and both memory reports.
All servers are up together and measured in interleaved rounds (an idle server waits on its
sockets), so a shared machine's drift reaches every configuration alike.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import secrets
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


ADMIN_KEY = secrets.token_hex(16)     # operator routes (flush, overlap level) need --admin-api-key
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def start_server(args: list[str], log_path: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "sgl_ess.launch_server", "--port", str(port), *args, "--admin-api-key", ADMIN_KEY]
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
           "--seed", str(getattr(a, "seed", 1)), "--disable-tqdm", "--output-file", out_file]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"bench_serving failed rc={r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    with open(out_file) as fh:
        lines = [json.loads(x) for x in fh if x.strip()]
    return cmd, lines[-1]


PAGE = 64   # DSA pools: 64-token pages
SPECULATIVE_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "4"]


def get_json(base: str, path: str) -> dict:
    with urllib.request.urlopen(base + path, timeout=120) as r:
        return json.loads(r.read())


def flush(base: str) -> None:
    urllib.request.urlopen(urllib.request.Request(base + "/flush_cache", method="POST", headers=ADMIN),
                           timeout=120).read()


def kv_device_bytes(memory: list[dict]) -> dict:
    """The KV side of a server's startup report (device rows other than weights / req_to_token)."""
    rows = {m["what"]: m["bytes"] for m in memory if m["where"] == "device"
            and m["what"] not in ("model weights", "req_to_token map")}
    return {"rows": rows, "total": sum(rows.values())}


def off_pool_tokens(on_status: dict, on_device: int) -> tuple[int, dict]:
    """ESS-off --max-total-tokens whose latents + index keys take `on_device` bytes."""
    s = on_status["schedulers"][0]
    layers = len(s.get("misses_per_layer") or (s.get("counters") or {}).get("layer_hits") or []) or None
    mem = {m["what"]: m["bytes"] for m in on_status["memory"]}
    host_rows = s["host_tokens_capacity"] + PAGE
    latent_row = s["host_bytes"] // host_rows                     # all layers, per token
    index_row = mem["index keys (every token)"] // host_rows       # all layers, per token
    tokens = (on_device // (latent_row + index_row)) // PAGE * PAGE - PAGE
    return tokens, {"latent_bytes_per_token": latent_row, "index_key_bytes_per_token": index_row,
                    "layers": layers}


def set_level(base: str, level: str) -> None:
    """Switch the running server's overlap level (POST /ess/overlap_level)."""
    req = urllib.request.Request(base + "/ess/overlap_level", data=json.dumps({"level": level}).encode(),
                                 headers={"Content-Type": "application/json", **ADMIN})
    with urllib.request.urlopen(req, timeout=60) as r:
        got = json.loads(r.read())
    if got.get("level") != level:
        raise RuntimeError(f"the server did not switch to overlap level {level}: {got}")


def median_run(runs: list[dict]) -> dict:
    """The run with the median output throughput (all its fields from that one run), plus every
    run's throughput: on a shared machine one short run can be off by several percent."""
    ranked = sorted(runs, key=lambda r: r["output_throughput_tok_s"] or 0.0)
    med = dict(ranked[(len(ranked) - 1) // 2])
    med["output_throughput_runs"] = [r["output_throughput_tok_s"] for r in runs]
    med["completed"] = min(r["completed"] or 0 for r in runs)
    return med


class Mode:
    """One server under test: started and warmed up, then measured in rounds (`measure`), then
    closed (`finish`: the OpenAI-backend pass, then stop)."""

    def __init__(self, name: str, args: list[str], a, tmp: str, levels: list[str] | None = None):
        self.name, self.args, self.a, self.tmp, self.levels = name, args, a, tmp, levels
        self.log = os.path.join(tmp, f"{name}.log")
        self.proc, self.base = start_server(args, self.log)
        try:
            self.status = get_json(self.base, "/ess/status")
            warm = argparse.Namespace(**{**vars(a), "num_prompts": a.warmup_prompts, "seed": 2})
            self.warm_cmd, _ = bench(self.base, "sglang", warm, os.path.join(tmp, f"{name}_warmup.jsonl"))
        except BaseException:
            stop_server(self.proc)
            raise
        self.runs: dict = {level: [] for level in levels or [None]}

    def measure(self, level: str | None, rep: int) -> float:
        if level is not None:
            set_level(self.base, level)
        flush(self.base)
        a = self.a
        with PeakRunning(self.log) as peak:
            cmd, res = bench(self.base, "sglang", a, os.path.join(self.tmp, f"{self.name}_{level}_{rep}.jsonl"))
        self.runs[level].append({"bench_command": cmd, "output_throughput_tok_s": res.get("output_throughput"),
                                 "avg_concurrency": res.get("concurrency"), "peak_running_requests": peak.peak,
                                 "completed": res.get("completed"), "num_prompts": a.num_prompts,
                                 "mean_ttft_ms": res.get("mean_ttft_ms"), "mean_itl_ms": res.get("mean_itl_ms"),
                                 "duration_s": res.get("duration"), "accept_length": res.get("accept_length")})
        return res.get("output_throughput") or 0.0

    def finish(self) -> dict:
        """The first level's median run is the entry; every level under 'by_level'."""
        try:
            by_level = {level: median_run(runs) for level, runs in self.runs.items()}
            first = (self.levels or [None])[0]
            entry = {"server_args": self.args, "warmup_command": self.warm_cmd, **by_level[first],
                     "memory_report": self.status.get("memory"),
                     "kv_device_bytes": kv_device_bytes(self.status.get("memory") or [])}
            if self.levels:
                entry["prefetch_engine"] = get_json(self.base, "/ess/status")["schedulers"][0]["prefetch"]["engine"]
                entry["by_level"] = by_level
            if self.a.oai_prompts:
                b = argparse.Namespace(**{**vars(self.a), "num_prompts": self.a.oai_prompts})
                oai_cmd, oai = bench(self.base, "sglang-oai", b, os.path.join(self.tmp, f"{self.name}_oai.jsonl"))
                entry["openai_backend"] = {"command": oai_cmd, "completed": oai.get("completed"),
                                           "output_throughput_tok_s": oai.get("output_throughput")}
            return entry
        finally:
            self.close()

    def close(self) -> None:
        stop_server(self.proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--hot-slots", type=int, default=48, help="ESS on: hot slots per request per layer")
    p.add_argument("--max-running", type=int, default=32, help="--max-running-requests for both servers")
    p.add_argument("--warmup-prompts", type=int, default=4, help="warm-up pass before each measured run")
    p.add_argument("--oai-prompts", type=int, default=4, help="prompts for the OpenAI-backend pass (0 = skip)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measured runs per server and level; the run with the median throughput is reported, "
                        "with every run's throughput (default 3)")
    p.add_argument("--ess-engines", default="auto",
                   help="comma list of --ess-prefetch-engine values; one ESS-on server each (auto, worker, inline)")
    p.add_argument("--ess-levels", default="da",
                   help="comma list of overlap levels measured on each ESS-on server, switched at run time "
                        "(none, da, dba, full); the first one is the headline row")
    p.add_argument("--no-pressure", action="store_true",
                   help="give ESS off a device pool as large as ESS on's host pool: no memory pressure on either, "
                        "so the ratio is the per-token cost of ESS (goal: ESS on >= 0.95x ESS off)")
    p.add_argument("--speculative", action="store_true",
                   help="EAGLE / NextN (MTP) on both servers: " + " ".join(SPECULATIVE_FLAGS) + " (issue 9); the "
                        "report adds bench_serving's acceptance length")
    a = p.parse_args()
    common = ["--max-running-requests", str(a.max_running), "--decode-log-interval", "1"]
    if a.speculative:
        common += SPECULATIVE_FLAGS
    # ESS on: a host pool that holds the whole workload (every request's prompt + output + a page)
    host_tokens = -(-a.num_prompts * (a.input_len + a.output_len + PAGE) // PAGE) * PAGE
    on_args = ["--ess-hot-slots-per-request", str(a.hot_slots), *common, "--max-total-tokens", str(host_tokens)]
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    report = {"suite": "serving", "workload": vars(a), "dataset": "random-ids (generated token ids, offline)",
              "accounting": "equal device bytes: ESS on = hot buffers + staging + index keys of every host-pool "
                            "token; ESS off = latents + index keys of every device-pool token", "modes": {}}
    tmp = tempfile.mkdtemp(prefix="sgl_ess_bench_")
    engines = a.ess_engines.split(",")
    levels = a.ess_levels.split(",")
    servers: list[Mode] = []
    try:
        for engine in engines:
            print(f"starting ESS on, engine {engine}", flush=True)
            servers.append(Mode(f"ess_on_{engine}", on_args + ["--ess-prefetch-engine", engine], a, tmp, levels))
        on_status = servers[0].status
        budget = kv_device_bytes(on_status.get("memory") or [])["total"]
        off_tokens, per_token = off_pool_tokens(on_status, budget)
        if a.no_pressure:
            off_tokens = host_tokens
            report["accounting"] = ("no memory pressure: ESS off's device pool holds as many tokens as ESS on's "
                                    "host pool")
        off_args = ["--ess-enabled", "false", "--max-total-tokens", str(off_tokens), *common]
        print("starting ESS off", flush=True)
        servers.insert(0, Mode("ess_off", off_args, a, tmp))
        # interleaved rounds: every (server, level) once per round, so slow drift of a shared machine
        # reaches every configuration alike; idle servers wait on their sockets
        for rep in range(a.repeats):
            for srv in servers:
                for level in srv.levels or [None]:
                    tps = srv.measure(level, rep)
                    print(f"round {rep + 1}/{a.repeats}  {srv.name:14} level={level}  {tps:7.1f} tok/s", flush=True)
        off = servers[0].finish()
        ons = {engine: (srv.finish(), srv.status) for engine, srv in zip(engines, servers[1:])}
    finally:
        for srv in servers:
            srv.close()
    on, on_status = ons[engines[0]]
    report["modes"] = {"ess_off": off, "ess_on": on}
    report["engines_x_levels"] = {
        engine: {level: {**e, "over_off": e["output_throughput_tok_s"] / off["output_throughput_tok_s"]}
                 for level, e in entry["by_level"].items()}
        for engine, (entry, _) in ons.items()}
    report["device_budget"] = {"ess_on_kv_device_bytes": budget, "ess_off_kv_device_bytes": off["kv_device_bytes"]["total"],
                               "ess_off_pool_tokens": off_tokens, "ess_on_host_pool_tokens": host_tokens, **per_token}
    report["ratios_on_over_off"] = {
        "output_throughput": on["output_throughput_tok_s"] / off["output_throughput_tok_s"],
        "peak_running_requests": on["peak_running_requests"] / max(1, off["peak_running_requests"]),
        "avg_concurrency": on["avg_concurrency"] / off["avg_concurrency"],
    }
    out = write_result(f"serving_{stamp}", report)
    print(f"{'mode':8} {'KV dev MB':>9} {'out tok/s':>10} {'avg conc':>9} {'peak run':>9} {'completed':>10}")
    for name, e in report["modes"].items():
        print(f"{name:8} {e['kv_device_bytes']['total'] / 1e6:>9.2f} {e['output_throughput_tok_s']:>10.1f} "
              f"{e['avg_concurrency']:>9.2f} {e['peak_running_requests']:>9} {e['completed']:>6}/{e['num_prompts']}")
    for engine, by in report["engines_x_levels"].items():
        for level, e in by.items():
            print(f"  ESS on engine={engine:6} level={level:4}  {e['output_throughput_tok_s']:8.1f} tok/s  "
                  f"peak running {e['peak_running_requests']:3}  ({e['over_off']:.2f}x ESS off)")
    r = report["ratios_on_over_off"]
    print(f"ESS on / off: output tok/s {r['output_throughput']:.2f}x, peak running {r['peak_running_requests']:.2f}x, "
          f"avg concurrency {r['avg_concurrency']:.2f}x (equal KV device bytes: {budget / 1e6:.2f} MB; "
          f"ESS off pool {off_tokens} tokens)")
    if a.speculative:
        print("acceptance length (EAGLE, 3 steps, topk 1, 4 draft tokens): " + ", ".join(
            f"{name} {e['accept_length']}" for name, e in report["modes"].items()))
    print("wrote", out)


if __name__ == "__main__":
    main()
