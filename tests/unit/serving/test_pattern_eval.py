"""The scheduler-side stop_regex hook (observe/pattern_eval.py) against SGLang's own stop check.

SGLang's ``Req._check_str_based_finish`` (Python re) is the reference: on random outputs and
patterns both engines accept, the hook (RE2) finishes the same requests at the same length with
the same reason. Then: a pattern only Python re runs, past the budget, aborts the request with a
400 naming the budget; and /health answers 503 with the watchdog's reason while a stall lasts."""

import asyncio
import json
import os
import random
import types

import pytest

sb = pytest.importorskip("sglang.srt.managers.schedule_batch")

from sgl_ess.integration.sglang.observe import pattern_eval  # noqa: E402


class _Tok:
    def decode(self, ids):
        return "".join("ab\n01 xyz"[i % 9] for i in ids)


def _req(output_ids, stop_regex, stop_strs=(), new_accepted_len=1):
    sp = types.SimpleNamespace(stop_strs=list(stop_strs), stop_regex_strs=list(stop_regex),
                               stop_str_max_len=max((len(s) for s in stop_strs), default=0),
                               stop_regex_max_len=2 ** 30 if stop_regex else 0)
    r = types.SimpleNamespace(sampling_params=sp, output_ids=list(output_ids), tokenizer=_Tok(), rid="r1",
                              decoded_text="", finished_reason=None, finished_len=None)
    for name in ("_stop_match_tail_len", "tail_str", "_locate_str_stop_finished_len", "_check_str_based_finish"):
        setattr(r, name, types.MethodType(getattr(sb.Req, name), r))
    return r


def _outcome(r):
    fr = r.finished_reason
    return None if fr is None else (type(fr).__name__, getattr(fr, "matched", None), r.finished_len)


PATTERNS = [r"\d\d", r"x[yz]+", r"^a", r"b\n0", r"(?:a|b)*1", r"z$", r"(?:.|.)*\x01"]


def test_the_hook_finishes_requests_exactly_as_sglang_does():
    rng = random.Random(38)
    pattern_eval._limits = (10_000.0, False)
    for _ in range(400):
        ids = [rng.randrange(0, 40) for _ in range(rng.randint(1, 30))]
        pats = rng.sample(PATTERNS, rng.randint(1, 2))
        n = rng.choice([1, 1, 2, 3])
        ref, ours = _req(ids, pats), _req(ids, pats)
        want = ref._check_str_based_finish(min(n, len(ids)))
        got = pattern_eval.around_check_str_based_finish(
            types.MethodType(sb.Req._check_str_based_finish, ours).__func__, ours, min(n, len(ids)))
        assert (got, _outcome(ours)) == (want, _outcome(ref)), (ids, pats, n)


def test_a_pattern_over_the_budget_aborts_the_request_naming_it():
    pattern_eval._limits = (50.0, True)
    r = _req([2] * 20 + [0] * 40, ["(?s)(?:.|.)*(?=\x01)"])          # lookahead: Python re, 2**60 paths
    assert pattern_eval.around_check_str_based_finish(sb.Req._check_str_based_finish, r, 1) is True
    fr = r.finished_reason
    assert isinstance(fr, sb.FINISH_ABORT) and fr.status_code == 400
    assert "--guard-pattern-budget-ms" in fr.message and "50 ms" in fr.message
    pattern_eval._limits = None


def test_health_answers_503_with_the_watchdog_reason_while_a_stall_lasts(tmp_path, monkeypatch):
    from sgl_ess.integration.sglang.observe import scheduler_watchdog
    from sgl_ess.integration.sglang.routes.health import EssHealthMiddleware

    monkeypatch.setattr(scheduler_watchdog, "stall_dir", lambda: str(tmp_path))
    called = []

    async def app(scope, receive, send):
        called.append(scope["path"])

    sent = []

    async def send(m):
        sent.append(m)

    mw = EssHealthMiddleware(app, timeout_s=1.0)
    path = tmp_path / f"sgl_ess_stall_{os.getpid()}_12345.json"
    path.write_text(json.dumps({"reason": "a scheduler step (run_batch) has run for 40.0 s"}))
    asyncio.run(mw({"type": "http", "path": "/health", "method": "GET"}, None, send))
    assert sent[0]["status"] == 503 and not called
    assert "run_batch" in json.loads(sent[1]["body"])["reason"]
    path.unlink()
    sent.clear()
    asyncio.run(mw({"type": "http", "path": "/health", "method": "GET"}, None, send))
    assert called == ["/health"]                          # no stall: SGLang's own /health answers first


@pytest.mark.parametrize("pattern", ["(", "a{99999999999}(?=b)", "(" * 2000 + "a" + ")" * 2000 + "(?<=b)"])
def test_a_pattern_python_re_cannot_compile_aborts_the_request_not_the_scheduler(pattern):
    """With --guard-allow-backtracking-stop-regex, a pattern RE2 refuses falls back to Python re; one
    that re cannot compile either (re.error, OverflowError, RecursionError) must abort the request
    with a 400, not escape into the scheduler's event loop."""
    pattern_eval._limits = (1000.0, True)
    try:
        r = _req([2, 3, 4], [pattern])
        assert pattern_eval.around_check_str_based_finish(sb.Req._check_str_based_finish, r, 1) is True
        fr = r.finished_reason
        assert isinstance(fr, sb.FINISH_ABORT) and fr.status_code == 400
        assert "stop_regex" in fr.message
    finally:
        pattern_eval._limits = None
