"""Issue 38, item 1-2: no client pattern stalls the scheduler.

A 15-byte stop_regex that backtracks (``(?:.|.)*\\x01``) kept SGLang 0.5.23's scheduler at 100% CPU
for minutes: /health and every other request timed out. Now stop regexes are searched with RE2
(linear time), and -- on this server, started with --guard-allow-backtracking-stop-regex -- a
pattern only Python re can run is searched under the per-request budget and aborted past it. In
both cases a greedy probe sent by another client meanwhile gets the same tokens as before, and
/health answers 200 throughout.

One server for the module (budget 300 ms per request and step).
"""

import json
import threading

import pytest

from ._http import call
from .conftest import _start

pytestmark = pytest.mark.integration

BACKTRACKER = "(?:.|.)*\u0001"              # RE2 evaluates it in linear time
LOOKAROUND = "(?s)(?:.|.)*(?=\u0001)"       # RE2 cannot compile it: Python re under the budget
PROBE = {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
LONG = 48                                   # output tokens: ~100+ characters, 2**100 paths for Python re


@pytest.fixture(scope="module")
def server_budget():
    srv = _start("pattern_budget", ["--max-running-requests", "8", "--guard-allow-backtracking-stop-regex", "true",
                                    "--guard-pattern-budget-ms", "300"], admin_key=None)
    yield srv
    srv.stop()


def _probe_ids(base: str) -> list[int]:
    status, text = call(base, "/generate", PROBE, timeout=300)
    assert status == 200, f"probe failed: {status} {text[:300]}"
    return json.loads(text)["output_ids"]


def _during(base: str, path: str, body: dict):
    """Send `body` in a thread; meanwhile probe and poll /health until it is answered. Returns
    (status, text, probe ids, health statuses seen)."""
    out, healths = {}, []

    def bad():
        out["r"] = call(base, path, body, timeout=240)
    t = threading.Thread(target=bad)
    t.start()
    probe_ids = _probe_ids(base)
    while t.is_alive():
        healths.append(call(base, "/health", timeout=60)[0])
        t.join(timeout=0.2)
    healths.append(call(base, "/health", timeout=60)[0])
    assert "r" in out, "the request with the pattern got no answer"
    return (*out["r"], probe_ids, healths)


def test_backtracking_stop_regex_is_served_in_linear_time_while_others_are_served(server_budget):
    base = server_budget.base
    before = _probe_ids(base)
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": LONG, "temperature": 0,
                                                             "ignore_eos": True, "stop_regex": BACKTRACKER}}
    status, text, during, healths = _during(base, "/generate", body)
    assert status == 200, f"{status}: {text[:300]}"
    assert during == before, "the probe's greedy tokens changed while the pattern ran"
    assert set(healths) == {200}, healths


def test_stop_regex_only_python_re_can_run_is_aborted_within_the_budget(server_budget):
    base = server_budget.base
    before = _probe_ids(base)
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": LONG, "temperature": 0,
                                                             "ignore_eos": True, "stop_regex": LOOKAROUND}}
    status, text, during, healths = _during(base, "/generate", body)
    assert status == 400, f"expected the budget's 400, got {status}: {text[:300]}"
    assert "--guard-pattern-budget-ms" in text and "300 ms" in text, text
    assert during == before, "the probe's greedy tokens changed while the pattern ran"
    assert set(healths) == {200}, healths
    assert _probe_ids(base) == before


def test_regex_grammar_with_the_same_pattern_does_not_stall_others(server_budget):
    """The grammar backend (xgrammar) runs the pattern as an automaton; bounded in size at ingress."""
    base = server_budget.base
    before = _probe_ids(base)
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                             "regex": BACKTRACKER}}
    status, text, during, healths = _during(base, "/generate", body)
    assert status == 200, f"{status}: {text[:300]}"
    assert during == before and set(healths) == {200}, healths


def test_openai_routes_take_the_same_stop_regex_path(server_budget):
    base = server_budget.base
    status, text = call(base, "/v1/completions", {"model": "default", "prompt": "Once upon a time", "max_tokens": 24,
                                                  "temperature": 0, "stop_regex": LOOKAROUND}, timeout=240)
    assert status == 400 and "--guard-pattern-budget-ms" in text, f"{status}: {text[:300]}"
    status, text = call(base, "/v1/chat/completions", {
        "model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24, "temperature": 0,
        "stop_regex": BACKTRACKER}, timeout=240)
    assert status == 200, f"{status}: {text[:300]}"
