"""WorkerEngine against InlineEngine with a real worker process and real ZMQ sockets: identical
bytes (host, slots, ring tags) and per-tier counters, tier order, and stray messages ignored."""
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from sgl_ess.prefetch.client import WorkerEngine
from sgl_ess.prefetch.engine import InlineEngine
from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.protocol import Done, Error, Heartbeat, encode
from tests.unit.prefetch.helpers import (ALL_TIERS, RING_BASE, T, clone_plan, copy_memory, make_memory, our_dirs,
                                         random_plan, same_bytes, wait_until)


@pytest.fixture(scope="module")
def started():
    """An engine, plus a ZMQ peer that connected to its events endpoint while the worker started
    (the only time the endpoint exists on disk): the stray-message test sends through it."""
    dirs_before = our_dirs()
    ctx = zmq.Context()
    peer = ctx.socket(zmq.PUSH)
    peer.setsockopt(zmq.LINGER, 0)
    seen = {}

    def connect_while_starting():
        end = time.monotonic() + 60
        while not seen and time.monotonic() < end:
            for d in our_dirs() - dirs_before:
                if (Path(d) / "events").exists():
                    seen["dir"], seen["mode"] = Path(d), Path(d).stat().st_mode & 0o777
                    peer.connect(f"ipc://{d}/events")
            time.sleep(0.002)
    th = threading.Thread(target=connect_while_starting)
    th.start()
    eng = WorkerEngine(make_memory(seed=1), chunk_rows=64)
    th.join()
    yield eng, peer, seen, dirs_before
    eng.close()
    peer.close()
    ctx.term()


@pytest.fixture(scope="module")
def engine(started):
    return started[0]


def test_ipc_dir_private_while_starting_and_gone_once_connected(started):
    eng, _, seen, dirs_before = started
    assert seen.get("mode") == 0o700
    assert not seen["dir"].exists() and our_dirs() == dirs_before


def _inline_rows(ref_mem, plans):
    inline = InlineEngine(ref_mem)
    for p in plans:
        inline.submit(clone_plan(p))
    return inline.stats()["tiers"]


def test_random_plans_same_bytes_as_inline(engine):
    rng = np.random.default_rng(7)
    ref = copy_memory(engine.mem)
    before = engine.stats()["tiers"]
    plans = []
    for _ in range(300):      # every kind x tier; tiers use disjoint rows (tiers may overtake each other)
        tier_i = int(rng.integers(0, 3))
        plans.append(random_plan(rng, ALL_TIERS[tier_i], parts=3, part=tier_i,
                                 max_rows=int(rng.choice([1, 40, 700]))))
    plans.append(random_plan(rng, "background", parts=3, part=1, kind="h2s", max_rows=300))
    plans.append(CopyPlan("h2s", torch.tensor([5]), torch.tensor([RING_BASE + 3]), tier="immediate", tag_seq=99))
    plans.append(CopyPlan("s2h", torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64),
                          tier="background"))                                     # empty plans complete too
    want = _inline_rows(ref, plans)
    tickets = [engine.submit(clone_plan(p)) for p in plans]
    for t in tickets[::37]:
        engine.wait(t)
    engine.drain()
    assert all(engine.done(t) for t in tickets)
    assert same_bytes(engine.mem, ref)
    assert int(engine.mem.ring_tags[3]) == 99
    after = engine.stats()
    assert after["restarts"] == 0 and after["faults"] == 0 and after["plans_inline"] == 0
    for tier in ALL_TIERS:
        got = {k: after["tiers"][tier][k] - before[tier][k] for k in ("plans", "done", "dropped", "rows")}
        assert got == {k: want[tier][k] for k in ("plans", "done", "dropped", "rows")}, tier


def test_immediate_overtakes_and_speculative_waits_or_drops(engine):
    """With the worker stopped (SIGSTOP) everything queues; after SIGCONT the worker serves the
    immediate plan first (the background plan has 64 chunks), then background, then speculative;
    the speculative plan past its deadline is dropped, not run."""
    rng = np.random.default_rng(3)
    ref = copy_memory(engine.mem)
    before = engine.stats()["tiers"]
    big = CopyPlan("s2h", torch.arange(0, 512).repeat(8), torch.arange(0, T), layer=0, tier="background")
    spec = random_plan(rng, "speculative", parts=4, part=2, kind="h2s")
    late = random_plan(rng, "speculative", parts=4, part=3, kind="h2s")
    late.deadline_s = time.monotonic() - 1.0
    imm = random_plan(rng, "immediate", parts=4, part=3, kind="s2h")
    spec.layer, late.layer, imm.layer = 1, 1, 2      # big writes all of host layer 0; nothing else touches it
    pid = engine.stats()["worker_pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        tickets = [engine.submit(clone_plan(p)) for p in (big, spec, late, imm)]
        time.sleep(0.2)                   # let the messages reach the stopped worker's socket
    finally:
        os.kill(pid, signal.SIGCONT)
    engine.drain()
    order = [(pid_, how) for pid_, _, how in engine.recent_completions()[-4:]]
    ids = [t.plan_id for t in tickets]
    assert order == [(ids[3], "worker"), (ids[0], "worker"), (ids[1], "worker"), (ids[2], "dropped")]
    _inline_rows(ref, [imm, big, spec])   # the order it ran in; the dropped plan changes nothing
    assert same_bytes(engine.mem, ref)
    st = engine.stats()["tiers"]
    assert st["speculative"]["dropped"] - before["speculative"]["dropped"] == 1
    assert st["speculative"]["done"] - before["speculative"]["done"] == 1
    assert st["background"]["rows"] - before["background"]["rows"] == 4096
    assert engine.stats()["faults"] == 0


def test_stray_messages_are_ignored_and_counted(started):
    """Forged events over a real ZMQ socket: a duplicate completion, one from an earlier
    incarnation, one for an unknown plan and garbage change nothing but the counters."""
    engine, sock = started[0], started[1]
    rng = np.random.default_rng(11)
    ref = copy_memory(engine.mem)
    p = random_plan(rng, "immediate", kind="h2s")
    t = engine.submit(clone_plan(p))
    engine.wait(t)
    _inline_rows(ref, [p])
    inc = engine.stats()["incarnation"]
    before = engine.stats()
    sock.send(encode(Done(inc=inc, id=t.plan_id, rows=5, busy_us=1, dropped=False)))      # duplicate
    sock.send(encode(Done(inc=inc - 1, id=t.plan_id, rows=5, busy_us=1, dropped=False)))  # earlier incarnation
    sock.send(encode(Done(inc=inc, id=10**9, rows=5, busy_us=1, dropped=False)))          # unknown id
    sock.send(encode(Error(inc=inc, id=10**9 + 1, msg="late")))                           # unknown id
    sock.send(encode(Heartbeat(inc=inc)))
    sock.send(b"not json")

    def seen():
        engine.done(t)
        s = engine.stats()
        return (s["late_or_duplicate"] - before["late_or_duplicate"] == 3 and
                s["stale_messages"] - before["stale_messages"] == 1 and
                s["bad_messages"] - before["bad_messages"] == 1)
    wait_until(seen, 10.0, "the forged messages to be counted")
    after = engine.stats()
    assert after["tiers"] == before["tiers"] and after["faults"] == 0
    p2 = random_plan(rng, "immediate", kind="s2h")           # still works, same bytes
    engine.wait(engine.submit(clone_plan(p2)))
    _inline_rows(ref, [p2])
    assert same_bytes(engine.mem, ref)


def test_bad_plan_in_worker_surfaces_inline_error(engine):
    """An index out of range fails in the worker; the client runs the plan inline, where the
    same error reaches the caller with both messages."""
    bad = CopyPlan("h2s", torch.tensor([T + 5]), torch.tensor([0]), tier="immediate")
    t = engine.submit(bad)
    with pytest.raises(RuntimeError, match=r"failed in the prefetch worker \(IndexError.*and again inline"):
        engine.wait(t)
    assert engine.done(t) and engine.stats()["faults"] == 0
