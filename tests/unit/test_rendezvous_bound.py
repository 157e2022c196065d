"""rendezvous_bound: SGLang's init_custom_process_group (gloo, tcp://) to a peer that accepts and stays
silent. torch's TCPStore client waits in its handshake with no timeout (timeout= alone does not end
it: checked here too, in a child killed after a bound); through the hook the call fails with torch's
error after --guard-blocking-timeout-s. Each case runs in a child process so a hang cannot hang pytest."""

import json
import os
import queue
import subprocess
import sys
import threading

import pytest

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.routes import rendezvous_bound  # noqa: E402

BLOCKING_TIMEOUT_S = 1.0
HANG_BOUND_S = 120          # a child still blocked after this long is taken as hung (not a speed claim)

CHILD = """
import socket, sys, threading
from datetime import timedelta
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(16)
port = srv.getsockname()[1]
held = []
def accept():
    while True:
        held.append(srv.accept()[0])               # accept, then say nothing
threading.Thread(target=accept, daemon=True).start()
from sglang.srt.utils import init_custom_process_group
from sgl_ess.integration.sglang.routes import rendezvous_bound
def call(mode):
    kw = dict(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=1, group_name=mode)
    print("CALLING", mode, flush=True)
    try:
        if mode == "hooked":
            rendezvous_bound._around_init_group(init_custom_process_group, **kw)
        else:
            init_custom_process_group(timeout=timedelta(seconds=%(t)s), **kw)
        print("RESULT returned", flush=True)
    except Exception as e:
        print("RESULT raised", type(e).__name__, str(e).splitlines()[0], flush=True)
call("hooked")
call("timeout-only")
""" % {"t": BLOCKING_TIMEOUT_S}


@pytest.fixture(scope="module")
def results():
    """{mode: RESULT line, or None when the call was still blocked after its bound}; one child (one
    SGLang import), the hooked call first, then the one with timeout= alone."""
    env = {**os.environ, "SGLESS_OPS": json.dumps({"guard_blocking_timeout_s": BLOCKING_TIMEOUT_S})}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in child.stdout], daemon=True).start()
    out = {}
    try:
        for mode, bound_s in (("hooked", HANG_BOUND_S), ("timeout-only", 10 * BLOCKING_TIMEOUT_S)):
            while True:                              # imports come first (slow on a loaded machine): not timed
                line = lines.get(timeout=600)
                if line.startswith("CALLING"):
                    break
            try:
                out[mode] = lines.get(timeout=bound_s).strip()
            except queue.Empty:
                out[mode] = None
                break
    finally:
        child.kill()
        child.wait()
    return out


def test_hooked_rendezvous_with_a_silent_peer_fails(results):
    assert results["hooked"] is not None, f"still blocked after {HANG_BOUND_S} s"
    assert results["hooked"].startswith("RESULT raised"), results


def test_timeout_argument_alone_does_not_end_it(results):
    """Why the hook also closes the connection: torch ignores timeout= in this wait."""
    assert "timeout-only" in results and results["timeout-only"] is None, results


def test_bounded_kwargs_keeps_a_callers_timeout():
    from datetime import timedelta

    assert rendezvous_bound.bounded_kwargs({"timeout": timedelta(seconds=7)}, 2.0)["timeout"].total_seconds() == 7
    assert rendezvous_bound.bounded_kwargs({"timeout": None}, 2.0)["timeout"].total_seconds() == 2.0
    assert rendezvous_bound.rendezvous_peer("tcp://10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert rendezvous_bound.rendezvous_peer("tcp://[::1]:29500") == ("::1", 29500)
    assert rendezvous_bound.rendezvous_peer("env://") is None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_bound_is_the_rendezvous_only_the_group_keeps_torchs_timeout(monkeypatch):
    """The guard's timeout bounds the rendezvous; the group it returns keeps the caller's timeout
    (none given: torch's default), so a later broadcast of update_weights_from_distributed is not cut
    after --guard-blocking-timeout-s by the collective watchdog."""
    import uuid

    import torch
    import torch.distributed.distributed_c10d as c10d
    from sglang.srt.utils import init_custom_process_group

    monkeypatch.setenv("SGLESS_OPS", json.dumps({"guard_blocking_timeout_s": 2.0}))
    pg = rendezvous_bound._around_init_group(init_custom_process_group, backend="gloo",
                                             init_method=f"tcp://127.0.0.1:{_free_port()}", world_size=1,
                                             rank=0, group_name=f"t-{uuid.uuid4().hex}")
    try:
        assert pg._get_backend(torch.device("cpu")).options._timeout == c10d.default_pg_timeout
        assert c10d._world.pg_map[pg][1].timeout == c10d.default_pg_timeout
    finally:
        c10d.destroy_process_group(pg)


def test_the_timer_cannot_cut_a_group_once_the_call_has_returned(monkeypatch):
    """The race: a timer firing between the call's return and its cancel must not cut the new group."""
    timers, cut = [], []

    class _Timer:
        def __init__(self, interval, fn):
            timers.append(fn)
            self.daemon = True

        def start(self):
            pass

        def cancel(self):
            pass                                     # as if it had fired already: give_up runs anyway

    monkeypatch.setenv("SGLESS_OPS", json.dumps({"guard_blocking_timeout_s": 2.0}))
    monkeypatch.setattr(rendezvous_bound.threading, "Timer", _Timer)
    monkeypatch.setattr(rendezvous_bound, "cut_connections", lambda host, port: cut.append((host, port)) or 1)
    out = rendezvous_bound._around_init_group(lambda **kw: "group", backend="gloo",
                                              init_method="tcp://127.0.0.1:29999", world_size=2, rank=1,
                                              group_name="g")
    assert out == "group" and len(timers) == 1
    timers[0]()                                      # fires late
    assert cut == []


def test_a_positional_call_the_hook_cannot_bound_is_logged(monkeypatch, caplog):
    monkeypatch.setenv("SGLESS_OPS", json.dumps({"guard_blocking_timeout_s": 2.0}))
    with caplog.at_level("WARNING", logger="sgl_ess.guard"):
        assert rendezvous_bound._around_init_group(lambda *a, **kw: a, "gloo", "tcp://127.0.0.1:1", None) == (
            "gloo", "tcp://127.0.0.1:1", None)
    assert any("--guard-blocking-timeout-s" in r.getMessage() and "positional" in r.getMessage()
               for r in caplog.records)
