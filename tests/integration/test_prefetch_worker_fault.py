"""Kill the prefetch worker with SIGKILL in the middle of decoding under load, on the real server:
every request completes with the same greedy tokens and log-probs as without the kill, the
scheduler restarts the worker (counted, one log line), usage returns to zero, and after the
server stops no worker process, no shared-memory segment and no ipc directory is left."""

import concurrent.futures as cf
import glob
import os
import shutil
import signal
import tempfile
import time

import pytest

from ._server import Server, group_alive, run_pids
from .conftest import HOT_SLOTS, MAX_RUNNING, _need_sglang

pytestmark = pytest.mark.integration

N_REQUESTS = 6
NEW_TOKENS = 48
WORKER_CMD = "sgl_ess.prefetch.worker"


def prompts():
    return [("def step_%d(state):\n    state[%d] += state[%d] * 3\n    return state\n" % (i, i, i + 1)) * 12
            for i in range(N_REQUESTS)]


def worker_pids(pgid: int) -> list[int]:
    """Prefetch worker processes in the server's process group."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if WORKER_CMD in cmd and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(pid))
    return out


def ipc_dirs(base: str) -> set[str]:
    return set(glob.glob(os.path.join(base, "sgless-prefetch-*")))


def shm_files() -> set[str]:
    """ESS's shared memory: named segments (there should be none: the store uses memfd) and memfd
    mappings still held by this run's processes (this pytest and what its servers started, orphans
    included: run_pids), not by another run on the same machine. SGLang's own /dev/shm entries are
    not ESS's to police."""
    names = {f for f in os.listdir("/dev/shm") if "ess" in f} if os.path.isdir("/dev/shm") else set()
    for pid in map(str, run_pids()):
        try:
            with open(f"/proc/{pid}/maps") as fh:
                names |= {f"pid {pid}: {ln.split()[-2]}" for ln in fh if "memfd:sgl_ess" in ln}
        except OSError:
            continue
    return names


def run_batch(server):
    with cf.ThreadPoolExecutor(N_REQUESTS) as ex:
        outs = list(ex.map(lambda p: server.generate(p, NEW_TOKENS), prompts()))
    return [[(t[1], t[0]) for t in o["meta_info"]["output_token_logprobs"]] for o in outs]


def test_sigkill_worker_mid_decode(tmp_path):
    _need_sglang()
    base = tempfile.mkdtemp(prefix="sgless-t-", dir="/tmp")     # this server's ipc base (TMPDIR), short
    shm_before, ipc_before = shm_files(), ipc_dirs(base)
    srv = Server("ess_worker_fault", ["--ess-prefetch-engine", "worker", "--ess-prefetch-overlap-level", "dba",
                                      "--ess-hot-slots-per-request", str(HOT_SLOTS),
                                      "--max-running-requests", str(MAX_RUNNING), "--max-total-tokens", "32768"],
                 env={"TMPDIR": base})
    try:
        srv.wait_healthy()
        first = worker_pids(srv.pgid)
        assert len(first) == 1, f"expected one prefetch worker, found {first}"
        srv.flush_cache()
        reference = run_batch(srv)
        srv.flush_cache()
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(run_batch, srv)
            # wait until decoding runs (rows are being fetched), then kill the worker
            start = srv.ess_usage()["rows_h2d"]
            deadline = time.time() + 120
            while srv.ess_usage()["rows_h2d"] - start < 200 and time.time() < deadline:
                time.sleep(0.05)
            assert not fut.done(), "the batch finished before the worker could be killed mid-decode"
            os.kill(first[0], signal.SIGKILL)
            got = fut.result(timeout=600)
        for i, (a, b) in enumerate(zip(got, reference)):
            assert len(a) == NEW_TOKENS, f"request {i} lost tokens"
            assert [t for t, _ in a] == [t for t, _ in b], f"request {i}: tokens changed by the worker kill"
            assert [lp for _, lp in a] == [lp for _, lp in b], f"request {i}: log-probs changed by the worker kill"
        u = srv.ess_usage()
        pf = u["prefetch"]
        assert pf["restarts"] >= 1 and pf["faults"] >= 1, pf
        new = worker_pids(srv.pgid)
        assert len(new) == 1 and new[0] != first[0], f"worker not restarted: {first} -> {new}"
        assert u["hot_requests_open"] == 0
        srv.wait_ess_zero()                 # live rows back to zero before any flush, then empty after one
        with open(srv.log.name, errors="replace") as fh:
            log = fh.read()
        lines = [ln for ln in log.splitlines() if "prefetch worker" in ln and "restarting it" in ln]
        assert len(lines) == 1 and "killed by SIGKILL" in lines[0], f"expected one clear line, got {lines}"
    finally:
        srv.stop()
    assert not group_alive(srv.pgid), "server processes left behind"
    assert not worker_pids(srv.pgid), "orphan prefetch worker"
    assert ipc_dirs(base) <= ipc_before, f"ipc directories left behind: {ipc_dirs(base) - ipc_before}"
    assert shm_files() <= shm_before, f"shared-memory segments left behind: {shm_files() - shm_before}"
    shutil.rmtree(base, ignore_errors=True)
