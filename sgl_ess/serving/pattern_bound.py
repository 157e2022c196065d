"""Client-supplied patterns: checked at ingress so that none is unbounded work for the scheduler.

Pure Python (no torch, no sglang); ``re2`` (google-re2, a dependency) is imported lazily.

SGLang 0.5.23 evaluates ``stop_regex`` with Python's backtracking ``re`` on the scheduler's one
thread, over the whole decoded output of the request for any pattern with an unbounded repeat
(its tail window is then 2**30 tokens). A 15-byte pattern such as ``(?:.|.)*\\x01`` takes time
exponential in the output length: the scheduler stops serving everybody. So:

  * every stop regex must compile with Python ``re`` (SGLang's own parser runs on it: ``re.error``
    there is a 500 today) and with RE2, the linear-time engine the scheduler evaluates it with
    (``integration/sglang/observe/pattern_eval.py``). RE2 refuses backreferences and lookaround;
    ``--guard-allow-backtracking-stop-regex true`` lets such patterns through to Python ``re``,
    bounded then only by the per-request budget (``--guard-pattern-budget-ms``).
  * RE2 and Python ``re`` differ in a few classes: ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII in
    RE2 and Unicode in Python. A stop regex relying on Unicode classes matches less under RE2.
  * every grammar (``regex``, ``json_schema``, ``ebnf``, ``structural_tag``; the OpenAI
    ``response_format``) is bounded by size (``--guard-max-pattern-kb``): the grammar backend
    (xgrammar) compiles it once and then advances a matcher per token; its compile cannot be
    interrupted, so its input is what is bounded. A ``json_schema`` must parse as JSON.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Optional

BACKTRACK_FLAG = "--guard-allow-backtracking-stop-regex"
SIZE_FLAG = "--guard-max-pattern-kb"
BUDGET_FLAG = "--guard-pattern-budget-ms"
GRAMMAR_FIELDS = ("regex", "json_schema", "ebnf", "structural_tag")
MAX_STOP_REGEXES = 16          # SGLang's own MAX_STOP_REGEX_COUNT is larger; each one is evaluated every step
JSON_DEPTH_LIMIT = 64          # nesting of a json_schema / custom_params value (see _depth)


@dataclass(frozen=True)
class PatternLimits:
    max_pattern_bytes: int
    allow_backtracking: bool


@dataclass(frozen=True)
class PatternProblem:
    param: str
    message: str


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


@lru_cache(maxsize=1024)
def re2_compiled(pattern: str) -> tuple[Any, Optional[str]]:
    """(RE2 pattern, None) if RE2 compiles `pattern`, else (None, RE2's reason); without logging to
    stderr. The one RE2 compile of a client pattern: ingress (``re2_error``) and the scheduler's
    evaluation (``stop_regex_eval.compiled``) share it and its cache."""
    import re2

    opts = re2.Options()
    opts.log_errors = False
    try:
        return re2.compile(pattern, options=opts), None
    except re2.error as e:
        reason = e.args[0] if e.args else e
        return None, reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)


def re2_error(pattern: str) -> Optional[str]:
    """None if RE2 compiles `pattern`, else RE2's reason."""
    return re2_compiled(pattern)[1]


def python_re_error(pattern: str) -> Optional[str]:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError) as e:   # OverflowError: a{99999999999}
        return f"{type(e).__name__}: {e}"
    return None


def _size(param: str, text: str, limits: PatternLimits) -> Optional[PatternProblem]:
    n = len(text.encode("utf-8", errors="surrogatepass"))
    if n > limits.max_pattern_bytes:
        return PatternProblem(param, f"{param}: got a pattern of {n} bytes; expected at most "
                                     f"{limits.max_pattern_bytes} (raise with {SIZE_FLAG})")
    return None


def check_stop_regex(param: str, value: Any, limits: PatternLimits) -> Optional[PatternProblem]:
    """`stop_regex`: None, a string, or a list of strings; each compiles, is bounded, and (unless
    backtracking is allowed) compiles with RE2."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value if isinstance(value, list) else None
    if items is None:
        return PatternProblem(param, f"{param}: got {_short(value)}; expected a string or a list of strings")
    if len(items) > MAX_STOP_REGEXES:
        return PatternProblem(param, f"{param}: got {len(items)} patterns; expected at most {MAX_STOP_REGEXES}")
    for i, p in enumerate(items):
        name = param if isinstance(value, str) else f"{param}[{i}]"
        if not isinstance(p, str):
            return PatternProblem(name, f"{name}: got {_short(p)}; expected a regular expression (a string)")
        r = _size(name, p, limits)
        if r:
            return r
        err = python_re_error(p)
        if err:
            return PatternProblem(name, f"{name}: got {_short(p)}, which does not compile ({err}); expected a "
                                        f"Python regular expression")
        if not limits.allow_backtracking:
            err = re2_error(p)
            if err:
                return PatternProblem(name, (
                    f"{name}: got {_short(p)}; this server evaluates stop patterns with RE2 (linear time, so one "
                    f"pattern cannot stall the scheduler), which cannot compile it ({err}): backreferences and "
                    f"lookaround are not supported. Rewrite the pattern, or start the server with "
                    f"{BACKTRACK_FLAG} true (Python re, bounded by {BUDGET_FLAG})"))
    return None


def json_depth(v: Any, limit: int) -> int:
    """Nesting depth of a JSON value, counted up to `limit` + 1 (iterative: no recursion)."""
    stack, deepest = [(v, 1)], 0
    while stack:
        x, d = stack.pop()
        if not isinstance(x, (dict, list)):
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((c, d + 1) for c in (x.values() if isinstance(x, dict) else x))
    return deepest


def check_grammar(param: str, value: Any, limits: PatternLimits, kind: str = "") -> Optional[PatternProblem]:
    """A grammar field of `kind` (default: the last part of `param`): a string (json_schema: a JSON
    document in a string, or an object) of bounded size and nesting."""
    if value is None:
        return None
    field = kind or param.rsplit(".", 1)[-1]
    if isinstance(value, (dict, list)) and field == "json_schema":
        d = json_depth(value, JSON_DEPTH_LIMIT)
        if d > JSON_DEPTH_LIMIT:
            return PatternProblem(param, f"{param}: nested more than {JSON_DEPTH_LIMIT} levels deep; expected at "
                                         f"most {JSON_DEPTH_LIMIT}")
        return _size(param, json.dumps(value), limits)
    if not isinstance(value, str):
        return PatternProblem(param, f"{param}: got {_short(value)}; expected a string")
    r = _size(param, value, limits)
    if r or field not in ("json_schema", "structural_tag"):
        return r
    try:
        doc = json.loads(value)
    except RecursionError:
        return PatternProblem(param, f"{param}: JSON nested too deeply to parse")
    except ValueError as e:
        return PatternProblem(param, f"{param}: not valid JSON ({e}); expected a JSON document")
    if json_depth(doc, JSON_DEPTH_LIMIT) > JSON_DEPTH_LIMIT:
        return PatternProblem(param, f"{param}: nested more than {JSON_DEPTH_LIMIT} levels deep; expected at most "
                                     f"{JSON_DEPTH_LIMIT}")
    return None


def check_sampling_patterns(prefix: str, sp: dict, limits: PatternLimits) -> Optional[PatternProblem]:
    """Every pattern field of one sampling-params dict (/generate, or a request object's)."""
    r = check_stop_regex(f"{prefix}stop_regex", sp.get("stop_regex"), limits)
    if r:
        return r
    for f in GRAMMAR_FIELDS:
        r = check_grammar(f"{prefix}{f}", sp.get(f), limits)
        if r:
            return r
    return None


def check_openai_patterns(body: dict, limits: PatternLimits) -> Optional[PatternProblem]:
    """The pattern fields of a /v1/completions or /v1/chat/completions body (SGLang's extensions
    ``stop_regex``, ``regex``, ``ebnf``, ``json_schema`` and the OpenAI ``response_format``)."""
    r = check_sampling_patterns("", body, limits)
    if r:
        return r
    rf = body.get("response_format")
    if isinstance(rf, dict):
        js = rf.get("json_schema")
        schema = rf.get("schema", js.get("schema", js.get("schema_")) if isinstance(js, dict) else None)
        if schema is not None:
            return check_grammar("response_format.json_schema.schema", schema, limits, "json_schema")
        if rf.get("type") == "structural_tag":
            text = json.dumps(rf)
            return _size("response_format", text, limits)
    return None
