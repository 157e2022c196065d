"""Worker faults with real processes: SIGKILL mid-stream (then close()), SIGTERM, a hung
(SIGSTOPped) worker, and the restart bound. Every plan completes with the bytes InlineEngine produces, each fault is
counted and logged in exactly one line, and no worker process is left behind."""
import logging
import os
import signal

import numpy as np
import pytest

from sgl_ess.prefetch.client import WorkerEngine
from sgl_ess.prefetch.engine import EngineDeadError
from tests.unit.prefetch.helpers import (ALL_TIERS, clone_plan, copy_memory, make_memory, open_fds, our_dirs, pid_alive,
                                         random_plan, run_inline, same_bytes, wait_until)


def _plans(rng, n):
    out = []
    for _ in range(n):          # tiers on disjoint rows: the worker may reorder tiers, inline does not
        i = int(rng.integers(0, 3))
        out.append(random_plan(rng, ALL_TIERS[i], parts=3, part=i, max_rows=int(rng.choice([1, 50, 600]))))
    return out


def _records(caplog, level):
    return [r for r in caplog.records if r.name == "sgl_ess.prefetch" and r.levelno == level]


def _check_tiers(eng, n_plans):
    st = eng.stats()["tiers"]
    assert sum(v["plans"] for v in st.values()) == n_plans
    assert all(v["done"] + v["dropped"] == v["plans"] for v in st.values())


def test_sigkill_mid_stream(caplog):
    caplog.set_level(logging.WARNING, logger="sgl_ess.prefetch")
    rng = np.random.default_rng(5)
    mem = make_memory(seed=2)
    ref = copy_memory(mem)
    fds_before, dirs_before = open_fds(), our_dirs()
    eng = WorkerEngine(mem, chunk_rows=64)
    try:
        first_pid = eng.stats()["worker_pid"]
        plans = _plans(rng, 400)
        run_inline(ref, plans)
        tickets = []
        for i, p in enumerate(plans[:300]):
            tickets.append(eng.submit(clone_plan(p)))
            if i == 150:
                os.kill(first_pid, signal.SIGKILL)
            if i % 50 == 49:
                eng.wait(tickets[int(rng.integers(0, len(tickets)))])
        eng.drain()
        assert eng.stats()["restarts"] == 1
        wait_until(lambda: (eng.drain(), eng.stats()["state"])[1] == "running", 60.0, "the restarted worker")
        by_worker = eng.stats()["plans_by_worker"]
        tickets += [eng.submit(clone_plan(p)) for p in plans[300:]]
        eng.drain()
        assert all(eng.done(t) for t in tickets)
        assert same_bytes(mem, ref)
        st = eng.stats()
        assert st["plans_by_worker"] > by_worker            # the new worker took over
        assert (st["restarts"], st["faults"], st["state"]) == (1, 1, "running")
        assert st["worker_pid"] != first_pid and not pid_alive(first_pid)
        _check_tiers(eng, 400)
        warns = _records(caplog, logging.WARNING)
        assert len(warns) == 1 and not _records(caplog, logging.ERROR)
        assert "killed by SIGKILL" in warns[0].getMessage() and "restarting it" in warns[0].getMessage()
        last = eng.submit(clone_plan(plans[-1]))
    finally:
        eng.close()
    # close(): drained, and nothing left: no process, no ipc dir, no fd (sockets, pidfd, ledger, log)
    assert eng.done(last)
    assert not pid_alive(st["worker_pid"]) and our_dirs() == dirs_before
    assert open_fds() - fds_before == set()                      # no fd opened by the engine is left open
    eng.close()                                                # idempotent
    with pytest.raises(EngineDeadError, match="after close"):
        eng.submit(clone_plan(plans[0]))


def test_sigterm_worker_exits_cleanly_and_is_replaced(caplog):
    caplog.set_level(logging.WARNING, logger="sgl_ess.prefetch")
    rng = np.random.default_rng(6)
    mem = make_memory(seed=3)
    ref = copy_memory(mem)
    eng = WorkerEngine(mem, chunk_rows=64)
    try:
        pid = eng.stats()["worker_pid"]
        plans = _plans(rng, 60)
        run_inline(ref, plans)
        tickets = [eng.submit(clone_plan(p)) for p in plans[:30]]
        os.kill(pid, signal.SIGTERM)
        tickets += [eng.submit(clone_plan(p)) for p in plans[30:]]
        wait_until(lambda: eng.stats()["faults"] == 1 or (eng.drain(), False)[1], 30.0, "the SIGTERM to be seen")
        eng.drain()
        assert all(eng.done(t) for t in tickets) and same_bytes(mem, ref)
        st = eng.stats()
        assert "exited with code 0" in st["last_fault"] and "exiting (SIGTERM)" in st["last_fault"]
        assert st["restarts"] == 1 and not pid_alive(pid)
        assert len(_records(caplog, logging.WARNING)) == 1
        _check_tiers(eng, 60)
    finally:
        eng.close()


def test_hung_worker_is_killed_and_its_plans_run_inline(caplog):
    caplog.set_level(logging.WARNING, logger="sgl_ess.prefetch")
    rng = np.random.default_rng(8)
    mem = make_memory(seed=4)
    ref = copy_memory(mem)
    eng = WorkerEngine(mem, hang_timeout_s=1.0)
    try:
        pid = eng.stats()["worker_pid"]
        plans = _plans(rng, 20)
        run_inline(ref, plans)
        os.kill(pid, signal.SIGSTOP)                         # alive but silent
        tickets = [eng.submit(clone_plan(p)) for p in plans]
        eng.wait(tickets[-1])
        eng.drain()
        assert all(eng.done(t) for t in tickets) and same_bytes(mem, ref)
        st = eng.stats()
        assert "hung: no message for 1.0 s with 20 plans outstanding" in st["last_fault"]
        assert st["faults"] == 1 and st["restarts"] == 1 and not pid_alive(pid)
        assert len(_records(caplog, logging.WARNING)) == 1
    finally:
        eng.close()


def test_restart_bound_falls_back_to_inline_for_good(caplog):
    caplog.set_level(logging.WARNING, logger="sgl_ess.prefetch")
    rng = np.random.default_rng(9)
    mem = make_memory(seed=5)
    ref = copy_memory(mem)
    eng = WorkerEngine(mem, max_restarts=1, restart_window_s=600)
    pids = []
    try:
        plans = _plans(rng, 40)
        run_inline(ref, plans)
        tickets = [eng.submit(clone_plan(p)) for p in plans[:10]]
        for _ in range(2):                                   # kill the worker, then the restarted one
            pid = eng.stats()["worker_pid"]
            pids.append(pid)
            faults = eng.stats()["faults"]
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: (eng.done(tickets[0]), eng.stats()["faults"])[1] == faults + 1, 30.0, "the kill")
        st = eng.stats()
        assert (st["state"], st["faults"], st["restarts"], st["worker_pid"]) == ("inline", 2, 1, None)
        tickets += [eng.submit(clone_plan(p)) for p in plans[10:]]
        eng.drain()
        assert all(eng.done(t) for t in tickets) and same_bytes(mem, ref)
        assert len(_records(caplog, logging.WARNING)) == 1
        errors = _records(caplog, logging.ERROR)
        assert len(errors) == 1 and "running every plan inline from now on" in errors[0].getMessage()
        assert "--ess-prefetch-engine inline" in errors[0].getMessage()
        assert not any(pid_alive(p) for p in pids)
        _check_tiers(eng, 40)
    finally:
        eng.close()
