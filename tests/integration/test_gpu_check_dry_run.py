"""The prepared GPU check (bench/gpu_check.sh, issue 32) cannot rot while no GPU is lent.

`--dry-run` runs every step on this CPU (--device cpu, tiny shapes) under bench/gpu_absent.py, which
refuses the packages the lent machine lacks (SGLang, sgl-kernel, FlashMLA, ...): tests/gpu is
collected and skips, the CUDA-only checks and benches record a skip with the reason, the step
kernels and the decode loop run their torch paths. Each step must leave its line in steps.jsonl.
The step table's timeouts must fit the budget (8 minutes of the device's 10); a table that breaks
it is refused before anything runs. The recorder's verdicts (timeout, fail, skip, a missing step)
are checked on hand-made inputs. Nothing here measures anything, and bench/results/ stays untouched.
"""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench/gpu_check.sh"
STEPS = ["preflight", "gpu_tests", "flashtrans", "step_kernels", "decode_loop"]
BUDGET_S = 480                      # the device's 10-minute command less 2 minutes of margin
DEVICE_FILES_MAX = 8                # the device tool returns at most 8 files from $OUT


def _env(out) -> dict:
    return {**os.environ, "OUT": str(out), "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}


def _run(out, *args, script=SCRIPT, env=None):
    return subprocess.run(["bash", str(script), *args], cwd=REPO, env={**_env(out), **(env or {})},
                          capture_output=True, text=True, timeout=600)


def _results_digest() -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((REPO / "bench/results").iterdir())
            if p.is_file()}


def _table(out) -> tuple[list[tuple[str, int]], int, int]:
    r = _run(out, "--steps")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    m = re.fullmatch(r"total (\d+) budget (\d+)", lines[-2])
    assert m, r.stdout
    return [(n, int(t)) for n, t in (line.split() for line in lines[:-2])], int(m[1]), int(m[2])


@pytest.fixture(scope="module")
def dry(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check_out")
    before = _results_digest()
    r = _run(out, "--dry-run")
    return out, r, before


def test_dry_run_records_every_step_in_order(dry):
    out, r, before = dry
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [d["name"] for d in lines] == STEPS
    status = {d["name"]: d["status"] for d in lines}
    # CUDA-only: a skip with its reason; the torch paths of the two benches run on the CPU
    assert status == {"preflight": "skip", "gpu_tests": "skip", "flashtrans": "skip", "step_kernels": "pass",
                      "decode_loop": "pass"}, lines
    assert all(d["result"] is not None and d["seconds"] >= 0 and (out / d["log"]).exists() for d in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["missing"] == [] and summary["failed"] == [] and summary["dry_run"] is True
    assert summary["sum_timeouts_s"] <= summary["budget_s"] == BUDGET_S
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= DEVICE_FILES_MAX, files                    # all of it comes back from the device
    assert _results_digest() == before                               # the repo's results are not overwritten


def test_dry_run_step_results_say_what_ran(dry):
    out, _, _ = dry
    res = {d["name"]: d["result"] for d in map(json.loads, (out / "steps.jsonl").read_text().splitlines())}
    pre = res["preflight"]
    assert pre["versions"]["gpu"] is None and "CUDA" in pre["skipped"]
    assert set(pre["checks"]) == {"memfd_register", "readonly_register", "stream_memops"}
    assert all(c["status"] == "skip" and c["fallback_when_missing"] for c in pre["checks"].values())
    junit = res["gpu_tests"]                                        # tests/gpu imported without SGLang
    assert junit["tests"] > 0 and junit["tests"] == junit["skipped"] and not junit["failed_tests"]
    assert (out / "gpu_tests.xml").exists()
    assert "CUDA" in res["flashtrans"]["skipped"]
    kern = res["step_kernels"]
    assert kern["measured"] is False and "skipped" in kern["resolver"]["triton"]
    assert kern["plan_epilogue"]["torch_us"]["n"] > 0 and "skipped" in kern["plan_epilogue"]["triton"]
    loop = res["decode_loop"]
    assert loop["measured"] is False and loop["trace"]["source"] == "synthetic"
    assert set(loop["overlap"]) == {"none", "da", "dba"}
    assert len(loop["hit_rate_per_layer"]) == loop["args"]["layers"]
    assert all(0.0 <= h <= 1.0 for h in loop["hit_rate_per_layer"])
    assert [(r["mode"], r["engine"]) for r in loop["ess"]] == [(m, e) for m in ("none", "da", "dba")
                                                               for e in ("null", "real")]
    eq = loop["equal_device_bytes"]                                 # resident gets ESS's bytes, fewer requests
    assert 1 <= eq["resident_batch"] <= eq["ess_batch"]
    assert loop["resident"]["device_pool_bytes"] <= loop["batch"]["device_bytes"]


def test_step_table_fits_the_budget(tmp_path):
    table, total, budget = _table(tmp_path)
    assert [n for n, _ in table] == STEPS
    assert budget == BUDGET_S and sum(t for _, t in table) == total <= BUDGET_S


def test_a_step_table_over_the_budget_is_refused_before_anything_runs(tmp_path):
    table, total, _ = _table(tmp_path)
    text = SCRIPT.read_text()
    last = re.search(rf"^{table[-1][0]}\s+{table[-1][1]}$", text, re.M)     # the table's last line
    assert last, text
    over = tmp_path / "bench" / "gpu_check.sh"
    over.parent.mkdir()
    over.write_text(f"{text[:last.end()]}\nextra_step  {BUDGET_S - total + 1}{text[last.end():]}")
    out = tmp_path / "out"
    for args in (("--steps",), ("--dry-run",)):
        r = _run(out, *args, script=over)
        assert r.returncode == 3 and f"sum to {BUDGET_S + 1} s, over the budget of {BUDGET_S} s" in r.stderr, r.stderr
    assert not (out / "steps.jsonl").exists()


def test_steps_cut_by_their_timeouts_are_recorded_and_the_next_ones_still_run(tmp_path):
    """Every limit set to 1 s and every step's command made to outlast it (the script's $PYTHON is a wrapper
    that sleeps 30 s for a step, `-m bench.gpu_absent ...`, and runs Python for the recorder): each step is
    cut, recorded as a timeout with its log, and the script goes on to the next and to the summary. (A step
    left to run Python itself may beat 1 s: a CUDA-less bench imports torch and records a skip in about that,
    which once made this test fail in a full run.)"""
    tree = tmp_path / "tree"                                  # the repo, with a copy of the script
    (tree / "bench").mkdir(parents=True)
    for p in (REPO / "bench").iterdir():
        if p.name != "gpu_check.sh":
            (tree / "bench" / p.name).symlink_to(p)
    for name in ("sgl_ess", "tests", "pyproject.toml"):
        (tree / name).symlink_to(REPO / name)
    table, _, _ = _table(tmp_path)
    text = SCRIPT.read_text()
    for name, limit in table:
        text, n = re.subn(rf"^{name}\s+{limit}$", f"{name}  1", text, flags=re.M)
        assert n == 1, name
    (tree / "bench" / "gpu_check.sh").write_text(text)
    slow = tmp_path / "python_slow_steps"
    slow.write_text(f'#!/bin/bash\nif [ "$1 $2" = "-m bench.gpu_absent" ]; then exec sleep 30; fi\n'
                    f'exec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    out = tmp_path / "out"
    r = _run(out, "--dry-run", script=tree / "bench" / "gpu_check.sh", env={"PYTHON": str(slow)})
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [(d["name"], d["status"], d["timeout_s"]) for d in lines] == [(n, "timeout", 1) for n in STEPS]
    assert all((out / d["log"]).exists() and d["log_tail"] is not None for d in lines)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == STEPS and summary["missing"] == []


def test_an_unknown_argument_is_refused(tmp_path):
    r = _run(tmp_path, "--dryrun")
    assert r.returncode == 2 and "unknown argument: --dryrun" in r.stderr


def test_steps_cannot_import_what_the_gpu_machine_lacks():
    r = subprocess.run([sys.executable, "-m", "bench.gpu_absent", "sglang.launch_server"], cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "not installed on the lent GPU machine" in r.stderr, r.stderr[-2000:]


# --- the recorder's verdicts on hand-made inputs ------------------------------------------------------

def _record(out, name, rc, result=None, junit=None, log="step output\n"):
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "logs" / f"{name}.log").write_text(log)
    args = ["record", "--out", str(out), "--name", name, "--rc", str(rc), "--seconds", "1.5", "--timeout-s", "9"]
    if result is not None:
        (out / f"{name}.json").write_text(result)
        args += ["--result", str(out / f"{name}.json")]
    if junit is not None:
        (out / "j.xml").write_text(junit)
        args += ["--junit", str(out / "j.xml")]
    r = subprocess.run([sys.executable, str(REPO / "bench/gpu_steps.py"), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "steps.jsonl").read_text().splitlines()[-1])


def test_recorder_keeps_a_cut_steps_partial_result_and_log(tmp_path):
    line = _record(tmp_path, "decode_loop", 124, result='{"ess": [{"mode": "none"}]}', log="x" * 5000 + "last words")
    assert line["status"] == "timeout" and line["result"] == {"ess": [{"mode": "none"}]}
    assert line["log_tail"].endswith("last words") and len(line["log_tail"]) < 5000
    assert _record(tmp_path, "a", 137)["status"] == "timeout"                 # killed after the grace period
    assert _record(tmp_path, "b", 1, result='{"ess": [')["result"]["unreadable"]   # cut while writing


def test_recorder_verdicts(tmp_path):
    assert _record(tmp_path, "a", 2, result='{"skipped": "no CUDA"}')["status"] == "skip"
    assert _record(tmp_path, "b", 0, result='{"x": 1}')["status"] == "pass"
    assert _record(tmp_path, "c", 1, result='{"x": 1}')["status"] == "fail"
    failing = ('<testsuites><testsuite tests="2" failures="1" errors="0" skipped="0"><testcase classname="t" '
               'name="ok"/><testcase classname="t" name="bad"><failure message="x"/></testcase></testsuite></testsuites>')
    line = _record(tmp_path, "d", 1, junit=failing)
    assert line["status"] == "fail" and line["result"]["failed_tests"] == ["t::bad"]
    skipped = '<testsuites><testsuite tests="2" failures="0" errors="0" skipped="2"></testsuite></testsuites>'
    assert _record(tmp_path, "e", 0, junit=skipped)["status"] == "skip"


def test_summary_fails_on_a_missing_step(tmp_path):
    _record(tmp_path, "preflight", 0, result='{"x": 1}')
    r = subprocess.run([sys.executable, str(REPO / "bench/gpu_steps.py"), "summary", "--out", str(tmp_path),
                        "--steps", "preflight:40 gpu_tests:150", "--budget-s", "480"], capture_output=True, text=True)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert r.returncode == 1 and summary["missing"] == ["gpu_tests"] and summary["failed"] == ["gpu_tests"]
    assert summary["sum_timeouts_s"] == 190
