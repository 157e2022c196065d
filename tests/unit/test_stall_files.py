"""The step watchdog's stall files (observe/scheduler_watchdog.py) are keyed by the launcher's run id,
which every process of the server inherits: with --dp-size > 1 the schedulers are grandchildren of the
HTTP process (children of SGLang's DataParallelController), and /health must still see their stalls.
The launcher's cleanup removes its run's stall files (a scheduler killed mid-stall leaves one)."""

import json
import os
import subprocess
import sys

from sgl_ess.integration.sglang.launcher import process_env, shm_files
from sgl_ess.integration.sglang.observe import scheduler_watchdog

GRANDCHILD = """
import json, sys
from sgl_ess.integration.sglang.observe import scheduler_watchdog
with open(scheduler_watchdog._stall_path(), "w") as fh:
    json.dump({"reason": "a scheduler step (run_batch) has run for 9.0 s"}, fh)
"""
CHILD = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1]]))"


def test_a_grandchild_schedulers_stall_is_seen_by_health(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv(process_env.ENV_RUN_ID, "run-38-test")
    monkeypatch.setattr(scheduler_watchdog, "stall_dir", lambda: str(tmp_path))
    subprocess.run([sys.executable, "-c", CHILD, GRANDCHILD], check=True)     # DP: a controller in between
    assert scheduler_watchdog.stall_reasons() == ["a scheduler step (run_batch) has run for 9.0 s"]


def test_another_runs_stall_is_not_ours_and_cleanup_removes_ours(tmp_path, monkeypatch):
    monkeypatch.setenv(process_env.ENV_RUN_ID, "run-a")
    monkeypatch.setattr(scheduler_watchdog, "stall_dir", lambda: str(tmp_path))
    monkeypatch.setattr(shm_files, "remove_all", lambda: [])
    ours = tmp_path / "sgl_ess_stall_run-a_4242.json"
    theirs = tmp_path / "sgl_ess_stall_run-b_4242.json"
    for p in (ours, theirs):
        p.write_text(json.dumps({"reason": p.name}))
    assert scheduler_watchdog.stall_reasons() == [ours.name]
    process_env.cleanup()                          # the launcher's exit path
    assert not ours.exists() and theirs.exists()


def test_apply_exports_a_run_id_every_server_process_inherits(monkeypatch):
    monkeypatch.setenv(process_env.ENV_RUN_ID, "before")           # so that monkeypatch restores it
    for name in ("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE", "GLOO_SOCKET_IFNAME", "SGLANG_USE_CPU_ENGINE",
                 "SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "SGLANG_PYSPY_DUMP_BEFORE_CRASH"):
        monkeypatch.setenv(name, os.environ.get(name, "x"))           # restored after the test
    process_env.apply("127.0.0.1", False, 1, None)
    run_id = os.environ[process_env.ENV_RUN_ID]
    assert run_id != "before" and run_id.startswith(f"{os.getpid()}-")
    assert scheduler_watchdog._stall_path().startswith(os.path.join(scheduler_watchdog.stall_dir(),
                                                                    f"sgl_ess_stall_{run_id}_"))
