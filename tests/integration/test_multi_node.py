"""Issue 17: two "nodes" on one machine through SGLang's own --nnodes / --node-rank / --dist-init-addr
(TP 2 over 2 nodes, one rank each, TCP rendezvous on 127.0.0.1, gloo on lo because the rendezvous
address is loopback). Checked: ESS on gives ESS off's greedy tokens and log-probs; each node keeps its
own host pool (pools are grouped by --node-rank, never by hostname, so the two "nodes" sharing a
machine must not share one); SIGKILL of one node's scheduler ends both launchers with the crash exit
code (5) and one fatal line, leaving no process and no host-pool segment behind.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from ._server import REPO, Server, free_port, group_alive, group_processes
from .conftest import _need_sglang

pytestmark = pytest.mark.integration
ARGS = ["--tp", "2", "--nnodes", "2", "--ess-hot-slots-per-request", "40", "--max-total-tokens", "4096"]
PROMPTS = [" ".join(f"n{i}t{j % 29}" for j in range(n)) for i, n in enumerate([5, 120, 260])]


def _node1(dist: str, extra: list[str]) -> subprocess.Popen:
    log = open(os.path.join("/tmp", f"sgl_ess_node1_{os.getpid()}_{time.time_ns()}.log"), "w")
    cmd = [sys.executable, "-m", "sgl_ess.launch_server", "--port", str(free_port()), *ARGS, "--node-rank", "1",
           "--dist-init-addr", dist, *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proc.log_path = log.name
    return proc


def _scheduler_pids(pgid: int) -> list[int]:
    return [pid for pid, cmd in group_processes(pgid).items() if "scheduler" in cmd]


def _host_inodes(pids) -> set[int]:
    inodes = set()
    for pid in pids:
        with open(f"/proc/{pid}/maps") as fh:
            for line in fh:
                if "/memfd:sgl_ess_host" in line:
                    inodes.add((pid, int(line.split()[4])))
    return inodes


def _two_nodes(name: str, extra: list[str]):
    _need_sglang()
    dist = f"127.0.0.1:{free_port()}"
    node1 = _node1(dist, extra)
    node0 = Server(name, ARGS + ["--node-rank", "0", "--dist-init-addr", dist] + extra)
    try:
        node0.wait_healthy()
    except Exception:
        node0.stop()
        _stop(node1)
        raise
    return node0, node1


def _stop(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + 20
        while time.time() < deadline and group_alive(proc.pid):
            time.sleep(0.2)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def nodes():
    out = {}
    for name, extra in (("off", ["--ess-enabled", "false"]), ("on", [])):
        node0, node1 = _two_nodes(f"node0_{name}", extra)
        try:
            out[name] = [node0.generate(p, 16) for p in PROMPTS]
            if name == "on":
                out["inodes"] = _host_inodes(_scheduler_pids(node0.pgid) + _scheduler_pids(node1.pid))
                victims = _scheduler_pids(node1.pid)
                assert victims, "no scheduler process found on node 1"
                os.kill(victims[0], signal.SIGKILL)
                out["rc1"] = node1.wait(timeout=120)
                out["rc0"] = node0.proc.wait(timeout=180)
                out["log0"], out["log1"] = node0.log_tail(80), open(node1.log_path).read()[-6000:]
                deadline = time.time() + 30
                while time.time() < deadline and (group_alive(node0.pgid) or group_alive(node1.pid)):
                    time.sleep(0.5)
                out["left"] = group_alive(node0.pgid) or group_alive(node1.pid)
        finally:
            node0.stop()
            _stop(node1)
    return out


def _tokens(rs):
    return [r["output_ids"] for r in rs]


def test_two_nodes_ess_on_gives_ess_off_tokens_and_logprobs(nodes):
    assert _tokens(nodes["on"]) == _tokens(nodes["off"])
    lp = lambda rs: [[t[0] for t in r["meta_info"]["output_token_logprobs"]] for r in rs]  # noqa: E731
    assert lp(nodes["on"]) == lp(nodes["off"])


def test_each_node_keeps_its_own_host_pool(nodes):
    inodes = nodes["inodes"]
    assert len(inodes) == 2 and len({i for _, i in inodes}) == 2, inodes     # two schedulers, two segments


def test_sigkill_of_one_nodes_rank_ends_both_nodes_with_one_line_and_nothing_left(nodes):
    assert nodes["rc1"] == 5, nodes["log1"][-2000:]
    assert nodes["rc0"] == 5, nodes["log0"]
    for log in (nodes["log0"], nodes["log1"]):
        fatal = [l for l in log.splitlines() if l.startswith("sgl_ess.launch_server: fatal:")]
        assert len(fatal) == 1, log[-2000:]
    assert not nodes["left"]
