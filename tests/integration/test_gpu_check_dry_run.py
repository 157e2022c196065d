"""Issue 16: the prepared GPU check cannot rot while no GPU is lent. `bash bench/gpu_check.sh
--dry-run` runs every step of the script on this CPU (--device cpu, tiny shapes): the CUDA tests
are collected (and skip), the kernel, prefetch and operator benches run, the CUDA-only benches
record that they skipped, and part 2 resolves both GPU servers' flags through the launcher and
SGLang's own parser without starting them. A renamed flag or a broken bench fails here. It measures
nothing, and it must leave bench/results/ untouched."""

import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
PARTS = ("versions", "kernels", "flashtrans", "flashmla", "prefetch_cuda", "ops_h200", "serving_gpu")


def _results_digest() -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((REPO / "bench/results").iterdir())
            if p.is_file()}


def _run(out, *args):
    env = {**os.environ, "OUT": str(out), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "bench/gpu_check.sh", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def test_every_step_of_the_gpu_check_runs_on_cpu(tmp_path):
    before = _results_digest()
    r = _run(tmp_path, "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [k for k in PARTS if "missing" in summary[k]] == [], {k: summary[k] for k in PARTS}
    assert summary["versions"]["gpu"] is None
    assert "skipped" in summary["flashtrans"] and "skipped" in summary["flashmla"]       # CUDA only, said so
    assert summary["kernels"]["meta"]["machine"]["cuda"] is False
    serving = summary["serving_gpu"]
    assert serving["dry_run"] and serving["model_shapes_applied"]
    for name, entry in serving["servers"].items():
        argv = entry["sglang_argv"]
        assert argv[argv.index("--device") + 1] == "cuda", (name, argv)
        assert entry["sglang_parsed"]["device"] == "cuda" and entry["sglang_parsed"]["attention_backend"] == "dsa"
    pools = {name: entry["pool"] for name, entry in serving["servers"].items()}
    assert pools["ess_on"]["ess_enabled"] and not pools["ess_off"]["ess_enabled"]
    graphs = {name: entry["sglang_argv"] for name, entry in serving["servers"].items()}
    decode = {name: argv[argv.index("--cuda-graph-backend-decode") + 1] if "--cuda-graph-backend-decode" in argv
              else None for name, argv in graphs.items()}
    assert decode == {"ess_off": "disabled", "ess_on": "disabled", "ess_on_graphs": "full"}, decode
    assert summary["tests_rc"] == 0                         # tests/gpu collected, every test skipped
    assert (tmp_path / "tests.xml").exists()
    assert {p.name for p in (tmp_path / "results").iterdir()} >= {"kernels_cpu.json", "prefetch.json", "ops_cpu.json"}
    assert _results_digest() == before                      # the repo's results are not overwritten


def test_an_unknown_argument_is_refused(tmp_path):
    r = _run(tmp_path, "--dryrun")
    assert r.returncode == 2 and "unknown argument: --dryrun" in r.stderr
