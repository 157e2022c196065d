"""The worker process on its own, driven over real ZMQ sockets exactly as the client does: the
ready handshake, done/dropped/error replies, the ledger written before `done`, and `stop`."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import orjson
import torch
import zmq

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.protocol import (PROTOCOL_VERSION, CompletionLedger, Done, Error, Ready, Stop, decode, encode,
                                       plan_message)
from tests.unit.prefetch.helpers import RING_BASE, T, make_memory


def _recv(sock, timeout_s=60.0):
    assert sock.poll(int(timeout_s * 1000)), f"no message from the worker within {timeout_s} s"
    return decode(sock.recv())


def _plan(pid, kind, src, dst, **kw):
    p = CopyPlan(kind, torch.as_tensor(src, dtype=torch.int64), torch.as_tensor(dst, dtype=torch.int64), **kw)
    p.plan_id = pid
    return p


def test_worker_protocol_end_to_end():
    mem, ledger = make_memory(seed=9), CompletionLedger(64)
    d = tempfile.mkdtemp(prefix="proto-test-")
    ctx = zmq.Context()
    plans, events = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    for s in (plans, events):
        s.setsockopt(zmq.LINGER, 0)
    plans.bind(f"ipc://{d}/p")
    events.bind(f"ipc://{d}/e")
    cfg = {"version": PROTOCOL_VERSION, "layout": mem.layout(), "parent_pid": os.getpid(),
           "ledger": {"fd": ledger.fd, "cap": 64}, "chunk_rows": 16, "heartbeat_s": 0.5, "incarnation": 7,
           "plans_endpoint": f"ipc://{d}/p", "events_endpoint": f"ipc://{d}/e"}
    proc = subprocess.Popen([sys.executable, "-m", "sgl_ess.prefetch.worker", "--config", orjson.dumps(cfg).decode()],
                            pass_fds=[*mem.fds(), ledger.fd], stderr=subprocess.PIPE)
    try:
        ready = _recv(events)
        assert ready == Ready(version=PROTOCOL_VERSION, pid=proc.pid, inc=7)

        want = mem.host[2, 100:150].clone()
        plans.send(encode(plan_message(_plan(0, "h2s", np.arange(100, 150), np.arange(RING_BASE, RING_BASE + 50),
                                             layer=2, tier="background", tag_seq=41))))
        done = _recv(events)
        assert (done.inc, done.id, done.rows, done.dropped) == (7, 0, 50, False)
        assert ledger.status(0) == "done"                  # written before the message was sent
        assert torch.equal(mem.slots[RING_BASE:RING_BASE + 50], want)
        assert mem.ring_tags[:50].tolist() == [41] * 50

        plans.send(encode(plan_message(_plan(1, "h2s", [1], [2], tier="speculative",
                                             deadline_s=time.monotonic() - 1))))
        assert _recv(events) == Done(inc=7, id=1, rows=0, busy_us=0, dropped=True)
        assert ledger.status(1) == "dropped"

        plans.send(encode(plan_message(_plan(2, "s2h", [0], [T + 1]))))     # host row out of range
        err = _recv(events)
        assert isinstance(err, Error) and err.id == 2 and "IndexError" in err.msg and ledger.status(2) is None

        plans.send(encode(plan_message(_plan(3, "zero", [-1, -1], [5, 6]))))  # it carries on after a bad plan
        assert _recv(events).id == 3 and int(mem.host[:, 5:7].sum()) == 0

        plans.send(encode(Stop()))
        assert proc.wait(30) == 0
        assert b"exiting (stop message)" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        plans.close()
        events.close()
        ctx.term()
        ledger.close()
        shutil.rmtree(d, ignore_errors=True)


def test_worker_refuses_another_protocol_version():
    proc = subprocess.run([sys.executable, "-m", "sgl_ess.prefetch.worker", "--config",
                           orjson.dumps({"version": PROTOCOL_VERSION + 1, "incarnation": 0}).decode()],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"config version {PROTOCOL_VERSION + 1}; expected {PROTOCOL_VERSION}" in proc.stderr


def test_worker_that_cannot_map_memory_says_why():
    """A layout naming an fd the worker did not inherit: a fatal `error` message, exit code 3."""
    mem, ledger = make_memory(seed=9), CompletionLedger(8)
    d = tempfile.mkdtemp(prefix="proto-test-")
    ctx = zmq.Context()
    events = ctx.socket(zmq.PULL)
    events.setsockopt(zmq.LINGER, 0)
    events.bind(f"ipc://{d}/e")
    layout = mem.layout()
    layout["host"]["fd"] = 999                                 # not passed down
    cfg = {"version": PROTOCOL_VERSION, "layout": layout, "parent_pid": os.getpid(),
           "ledger": {"fd": ledger.fd, "cap": 8}, "chunk_rows": 16, "heartbeat_s": 0.5, "incarnation": 0,
           "plans_endpoint": f"ipc://{d}/p", "events_endpoint": f"ipc://{d}/e"}
    proc = subprocess.Popen([sys.executable, "-m", "sgl_ess.prefetch.worker", "--config", orjson.dumps(cfg).decode()],
                            pass_fds=[*mem.fds(), ledger.fd], stderr=subprocess.DEVNULL)
    try:
        err = _recv(events)
        assert isinstance(err, Error) and err.id == -1 and "worker start failed: OSError" in err.msg
        assert proc.wait(30) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        events.close()
        ctx.term()
        ledger.close()
        shutil.rmtree(d, ignore_errors=True)
