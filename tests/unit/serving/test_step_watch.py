"""The step watchdog's bookkeeping (issue 38): a step past the bound is reported once, with the
request whose pattern is being evaluated as the one to abort; a step within it never."""

from types import SimpleNamespace

from sgl_ess.serving.step_watch import WATCHDOG_FLAG, StepWatch


def _batch(*rids):
    return SimpleNamespace(reqs=[SimpleNamespace(rid=r) for r in rids])


def test_a_step_within_the_bound_is_never_reported():
    w = StepWatch(2.0)
    w.begin("run_batch", _batch("a"), now=10.0)
    assert w.check(11.9) is None and w.check(12.0) is None
    assert w.end() is False


def test_a_long_step_is_reported_once_naming_the_request_in_pattern_evaluation():
    w = StepWatch(2.0)
    req = SimpleNamespace(rid="slow")
    w.begin("process_batch_result", _batch("fast", "slow"), now=0.0)
    w.pattern_begin(req, "slow")
    s = w.check(2.5)
    assert s is not None and s.culprit is req and s.culprit_rid == "slow" and s.rids == ("fast", "slow")
    assert "stop_regex of request slow" in s.reason(2.0) and WATCHDOG_FLAG in s.reason(2.0)
    assert w.check(3.0) is None                       # once per step
    w.pattern_end()
    assert w.end() is True                            # the report is withdrawn
    w.begin("run_batch", _batch("x"), now=10.0)
    s = w.check(13.0)
    assert s.culprit is None and "requests x" in s.reason(2.0)   # not in a pattern: logged, nobody blamed
    assert w.end() is True
