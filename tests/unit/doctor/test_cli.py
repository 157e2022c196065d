"""`python -m sgl_ess.doctor --json` on this machine: JSON parses, the exit code follows the rule,
and without a GPU the GPU checks say so with a reason."""
import glob
import json
import os
import subprocess
import sys

import pytest

from sgl_ess.doctor.finding import STATUSES, Finding, exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.skipif(bool(glob.glob("/dev/nvidia[0-9]*")), reason="the no-GPU path; this machine has a GPU")
def test_cpu_run_skips_gpu_checks_and_exits_by_the_rule():
    proc = subprocess.run([sys.executable, "-m", "sgl_ess.doctor", "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    rows = json.loads(proc.stdout)
    assert rows and all(set(r) == {"check", "status", "detail", "fix"} for r in rows)
    assert all(r["status"] in STATUSES for r in rows)
    assert proc.returncode == (1 if any(r["status"] == "fail" for r in rows) else 0), proc.stderr
    by_check = {r["check"]: r for r in rows}
    probe = by_check["gpu-probe"]
    assert probe["status"] == "skip" and probe["detail"].startswith("no GPU: skipped (")
    assert {"pcie", "host-memory", "memlock", "numa", "thp", "ipc", "pd-mooncake", "pd-ibverbs",
            "pd-router"} <= set(by_check)


def test_exit_code_rule():
    assert exit_code([Finding("a", "ok", ""), Finding("b", "warn", "", "x"), Finding("c", "skip", "")]) == 0
    assert exit_code([Finding("a", "ok", ""), Finding("b", "fail", "", "x")]) == 1


def test_cli_reads_meminfo_and_capabilities_from_proc_root(tmp_path, capsys):
    import resource

    from sgl_ess.doctor import cli
    from tests.unit.doctor.fake_tree import meminfo, write

    meminfo(tmp_path / "meminfo", total_kb=64 * 10**6, available_kb=60 * 10**6)
    write(tmp_path / "self" / "status", "Name:\tpython\nCapEff:\t0000000000000000")   # no CAP_IPC_LOCK
    want = 10**15
    rc = cli.main(["--json", "--no-probe", "--proc-root", str(tmp_path), "--pool-gb", "30", "--lock-bytes", str(want)])
    rows = {r["check"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["host-memory"]["status"] == "ok" and "30.00 GB" in rows["host-memory"]["detail"]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    inf = resource.RLIM_INFINITY
    expected = "ok" if soft == inf or soft >= want else ("warn" if hard == inf or hard >= want else "fail")
    assert rows["memlock"]["status"] == expected
    assert rc == (1 if any(r["status"] == "fail" for r in rows.values()) else 0)
