"""The scheduler evaluates ``stop_regex`` with RE2 within a per-request budget (issue 38, item 1-2).

AROUND hook on ``Req._check_str_based_finish`` (targets.STOP_STR_CHECK), registered by
``ops_hooks.load_plugin`` in every process SGLang starts with the sgl-ess plugins, and so active
in the scheduler processes of a server launched by ``sgl_ess.launch_server`` (the hook is a
no-op for requests without ``stop_regex``).

SGLang 0.5.23 searches each stop regex with Python ``re`` over the request's decoded tail, on the
scheduler's one thread; a backtracking pattern stalls every request for minutes. Here:
  1. the stop *strings* are checked by SGLang's own code (the method, with the regex list hidden);
  2. each stop regex is searched by ``sgl_ess.serving.stop_regex_eval.Budget``: RE2 (linear time),
     or with ``--guard-allow-backtracking-stop-regex`` Python ``re`` under a deadline;
  3. a match is located as SGLang locates it (the shortest prefix of the newly accepted tokens
     whose decoded text matches), with the same matcher and budget;
  4. past the budget (``--guard-pattern-budget-ms``, one request in one step) the request is
     aborted (FINISH_ABORT, 400) with a message naming the budget; the others keep being served.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus

from sgl_ess.serving.ops_config import ops_from_env
from sgl_ess.serving.stop_regex_eval import Budget, PatternBudgetExceeded, budget_for

from . import scheduler_watchdog

logger = logging.getLogger("sgl_ess.patterns")
_limits: tuple[float, bool] | None = None


def _settings() -> tuple[float, bool]:
    global _limits
    if _limits is None:
        ops = ops_from_env()
        _limits = (ops.guard_pattern_budget_ms, ops.guard_allow_backtracking_stop_regex)
    return _limits


def _locate(req, new_accepted_len: int, budget: Budget, pattern: str, full_window_matched: bool):
    """SGLang's ``Req._locate_str_stop_finished_len`` for a regex, with our matcher."""
    tail_len = req._stop_match_tail_len(new_accepted_len)
    start = len(req.output_ids) - tail_len
    window = req.output_ids[start:]
    for count in range(max(1, len(window) - new_accepted_len + 1), len(window)):
        if budget.search(pattern, req.tokenizer.decode(window[:count])):
            return start + count
    return len(req.output_ids) if full_window_matched else None


def around_check_str_based_finish(original_fn, req, new_accepted_len: int = 1, *args, **kwargs):
    sp = req.sampling_params
    patterns = sp.stop_regex_strs
    if not patterns:
        return original_fn(req, new_accepted_len, *args, **kwargs)
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISHED_MATCHED_REGEX

    sp.stop_regex_strs = []                           # SGLang's stop-string check alone
    try:
        if original_fn(req, new_accepted_len, *args, **kwargs):
            return True
    finally:
        sp.stop_regex_strs = patterns
    budget = budget_for(*_settings())
    w = scheduler_watchdog.watch()
    if w is not None:
        w.pattern_begin(req, req.rid)
    try:
        tail = req.tail_str(new_accepted_len)
        for pattern in patterns:
            if budget.search(pattern, tail):
                finished_len = _locate(req, new_accepted_len, budget, pattern, True)
            elif new_accepted_len > 1:                # an end-anchored match after a mid-step token
                finished_len = _locate(req, new_accepted_len, budget, pattern, False)
            else:
                finished_len = None
            if finished_len is not None:
                req.finished_reason = FINISHED_MATCHED_REGEX(matched=pattern)
                req.finished_len = finished_len
                return True
    except PatternBudgetExceeded:
        message = budget.message(req.rid)
        logger.warning("%s (patterns %r)", message, [p[:80] for p in patterns])
        req.finished_reason = FINISH_ABORT(message, HTTPStatus.BAD_REQUEST, "BadRequestError")
        return True
    except (ValueError, re.error, RecursionError, OverflowError) as e:   # a pattern ingress should have refused
        message = f"stop_regex: {e}" if "stop_regex" not in str(e) else str(e)
        logger.warning("request %s: %s; aborting it", req.rid, message)
        req.finished_reason = FINISH_ABORT(message, HTTPStatus.BAD_REQUEST, "BadRequestError")
        return True
    finally:
        if w is not None:
            w.pattern_end()
    return False


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.STOP_STR_CHECK, around_check_str_based_finish, HookType.AROUND)
