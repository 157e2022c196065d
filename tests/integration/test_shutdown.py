"""Issue 20, finding 6: SIGTERM drains for a bounded time, and a dead scheduler's streams end with
an error event instead of a cut body. Each test ends its own server; the module starts the three at
once (their starts overlap; an idle one sleeps)."""

import json
import os
import signal
import threading
import time
import urllib.request

import psutil
import pytest

from ._http import call
from ._server import group_alive, start_together

pytestmark = pytest.mark.integration
LONG_STREAM = {"text": "hello", "stream": True, "sampling_params": {"max_new_tokens": 6000, "ignore_eos": True}}
EXIT_WAIT_S = 180            # a hang guard, not a speed requirement


def _stream(base: str, events: list) -> None:
    req = urllib.request.Request(base + "/generate", data=json.dumps(LONG_STREAM).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            for line in r:
                if line.strip():
                    events.append(line.strip())
        events.append(b"<closed cleanly>")
    except Exception as e:  # noqa: BLE001 - a cut body surfaces here
        events.append(f"<broken: {e!r}>".encode())


def _start_streaming(srv):
    events = []
    t = threading.Thread(target=_stream, args=(srv.base, events))
    t.start()
    deadline = time.time() + 120
    while len(events) < 5 and time.time() < deadline:
        time.sleep(0.2)
    assert len(events) >= 5, f"the stream did not start: {events}"
    return t, events


def _last_data(events) -> dict:
    data = [e for e in events if e.startswith(b"data: {")]
    return json.loads(data[-1][6:])


def _wait_exit(srv) -> int:
    try:
        return srv.proc.wait(timeout=EXIT_WAIT_S)
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def servers():
    """{test's server name: Server}: each test takes its own out and ends it; any left are stopped here."""
    common = ["--max-total-tokens", "16384", "--max-running-requests", "4"]
    out = start_together({"sigterm": (common + ["--ess-drain-timeout-s", "3"], None),
                          "crash_stream": (common, None), "sigterm_group": (common, None)})
    yield out
    for srv in out.values():
        srv.stop()


def test_sigterm_refuses_new_requests_drains_for_the_timeout_then_ends_streams_with_an_error(servers):
    srv = servers.pop("sigterm")
    try:
        srv.wait_healthy()
        t, events = _start_streaming(srv)
        os.kill(srv.proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        st, text = call(srv.base, "/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}, timeout=60)
        assert st == 503 and "shutting down" in text, f"new request during drain: {st} {text[:200]}"
        st, _ = call(srv.base, "/health", timeout=60)
        assert st == 503
        t.join(timeout=EXIT_WAIT_S)
        assert events[-1] == b"<closed cleanly>" and events[-2] == b"data: [DONE]", events[-3:]
        last = _last_data(events)
        reason = last["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 503 and "drain timeout" in reason["message"], last
        rc = _wait_exit(srv)
        assert rc == 0, f"exit code {rc} after SIGTERM:\n{srv.log_tail()}"
    finally:
        srv.stop()
    assert not group_alive(srv.pgid)


def test_a_dead_scheduler_ends_open_streams_with_an_error_event_and_exit_5(servers):
    srv = servers.pop("crash_stream")
    try:
        srv.wait_healthy()
        t, events = _start_streaming(srv)
        sched = [p for p in psutil.Process(srv.proc.pid).children(recursive=True) if "scheduler" in p.name().lower()
                 or "scheduler" in " ".join(p.cmdline()).lower()]
        assert sched, [p.name() for p in psutil.Process(srv.proc.pid).children(recursive=True)]
        sched[0].kill()
        t.join(timeout=EXIT_WAIT_S)
        assert events[-1] == b"<closed cleanly>", f"the stream was cut: {events[-3:]}"
        reason = _last_data(events)["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 500 and "died" in reason["message"], reason
        rc = _wait_exit(srv)
        assert rc == 5, f"exit code {rc}:\n{srv.log_tail()}"
    finally:
        srv.stop()
    assert not group_alive(srv.pgid)


def test_sigterm_to_the_whole_process_group_is_a_stop_exit_0_and_streams_end_with_an_error_event(servers):
    """systemd's default KillMode=control-group (or `kill -TERM -PGID`) sends SIGTERM to every process at
    once: the schedulers exit before any drain. That is the stop that was asked for: exit 0 and one
    "stopped" line, not "fatal ... exit 5"; an open stream ends with a 503 error event, not a cut body."""
    srv = servers.pop("sigterm_group")
    try:
        srv.wait_healthy()
        t, events = _start_streaming(srv)
        os.killpg(srv.pgid, signal.SIGTERM)
        t.join(timeout=EXIT_WAIT_S)
        rc = _wait_exit(srv)
        log = srv.log_tail(4000)
        assert rc == 0, f"exit code {rc} after a process-group SIGTERM:\n{log}"
        assert "sgl_ess.launch_server: stopped: SIGTERM reached the server processes too" in log, log
        assert "launch_server: fatal" not in log, log
        assert events[-1] == b"<closed cleanly>", f"the stream was cut: {events[-3:]}"
        reason = _last_data(events)["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and reason["status_code"] == 503, reason
    finally:
        srv.stop()
    assert not group_alive(srv.pgid)
