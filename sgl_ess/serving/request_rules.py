"""The request guard's rules: check a JSON request body before SGLang sees it.

Pure Python (no torch, no sglang), so every rule is unit-testable. ``check()`` returns None when
the body may go on to SGLang, else a ``Refusal`` whose message names the field, the value received
and what is allowed (and the launcher flag that moves a limit). Each rule exists because SGLang
0.5.23 either crashed its scheduler on such a request (out-of-vocabulary or negative token ids,
``logprobs`` beyond the vocabulary, an empty prompt on a tokenizer without BOS), queued it
without bound (``n`` = 1e6), or answered wrongly (``n`` = -1 gave 200, ``seed`` ignored).

Two places apply these rules. The request guard checks the JSON bodies of /v1/completions,
/v1/chat/completions and /generate (any method) for its precise field names. The tokenizer manager
checks every request object, whatever route or method built it (``check_generate_fields`` on
``GenerateReqInput``'s fields), and after tokenization the prompt against the pool
(admission.py) -- so no route can walk around a rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .ops_config import OpsConfig
from .pattern_bound import (JSON_DEPTH_LIMIT, PatternLimits, PatternProblem, check_openai_patterns,
                            check_sampling_patterns, json_depth)
from .prompt_bound import prompt_too_long

COMPLETIONS, CHAT, GENERATE = "/v1/completions", "/v1/chat/completions", "/generate"
DETOKENIZE = ("/v1/detokenize", "/detokenize")
GUARDED_PATHS = (COMPLETIONS, CHAT, GENERATE, *DETOKENIZE)


@dataclass(frozen=True)
class ServingFacts:
    vocab_size: Optional[int]                 # None: unknown (ids are still checked after tokenization)
    model_names: tuple[str, ...]              # accepted values of "model" (the first ones are shown)
    deterministic: bool                       # --enable-deterministic-inference
    shown_names: int = 2                      # how many to name in a refusal (the rest may be paths)
    context_len: Optional[int] = None         # the model's context (tokens); None: prompt length not pre-checked
    max_chars_per_token: Optional[int] = None  # no token covers more characters (prompt_bound.py); None: unknown


@dataclass(frozen=True)
class Refusal:
    status: int        # 400, or 404 for an unknown model
    param: str         # the JSON field, e.g. "prompt[2]"
    message: str
    code: str = "invalid_request_error"


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_range(param: str, v: Any, lo: int, hi: Optional[int], hint: str = "") -> Optional[Refusal]:
    if v is None:
        return None
    allowed = f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
    if not _is_int(v) or v < lo or (hi is not None and v > hi):
        return Refusal(400, param, f"{param}: got {_short(v)}; expected {allowed}{hint}")
    return None


def _token_ids(param: str, ids: list, vocab: Optional[int], context_len: Optional[int] = None) -> Optional[Refusal]:
    if len(ids) == 0:
        return Refusal(400, param, f"{param}: got an empty list of token ids; expected at least one token id")
    if context_len is not None and len(ids) >= context_len:     # before looking at each id
        return Refusal(400, param, f"{param}: got {len(ids)} token ids; the model's context is {context_len} "
                                   f"tokens, so a prompt must have fewer")
    for i, t in enumerate(ids):
        if not _is_int(t):
            return Refusal(400, f"{param}[{i}]", f"{param}[{i}]: got {_short(t)}; expected an integer token id")
        if t < 0 or (vocab is not None and t >= vocab):
            rng = f"[0, {vocab})" if vocab is not None else ">= 0"
            return Refusal(400, f"{param}[{i}]", f"{param}[{i}]: got token id {t}; expected an id in {rng} "
                                                 f"(the model's vocabulary)")
    return None


def _text(param: str, s: str, facts: Optional[ServingFacts] = None) -> Optional[Refusal]:
    if s == "":
        return Refusal(400, param, f"{param}: got an empty string; expected text of at least one token "
                                   f"(this tokenizer adds no start token, so empty text is zero tokens)")
    if facts is not None:
        why = prompt_too_long(len(s), facts.context_len, facts.max_chars_per_token)
        if why:
            return Refusal(400, param, f"{param}: {why}")
    return None


def _prompt(param: str, p: Any, limits: OpsConfig, vocab: Optional[int],
            facts: Optional[ServingFacts] = None) -> Optional[Refusal]:
    """A completions 'prompt' / generate 'text' / 'input_ids': str | [str] | [int] | [[int]]."""
    ctx = facts.context_len if facts is not None else None
    if isinstance(p, str):
        return _text(param, p, facts)
    if not isinstance(p, list):
        return None                                    # SGLang's own schema check answers (sanitized)
    if len(p) == 0:
        return Refusal(400, param, f"{param}: got an empty list; expected a prompt (text or token ids)")
    if _is_int(p[0]) or isinstance(p[0], (float, bool)):
        return _token_ids(param, p, vocab, ctx)       # one prompt given as token ids
    if len(p) > limits.guard_max_batch:
        return Refusal(400, param, f"{param}: got a batch of {len(p)} prompts; expected at most "
                                   f"{limits.guard_max_batch} (raise with --guard-max-batch)")
    for i, item in enumerate(p):
        if isinstance(item, str):
            r = _text(f"{param}[{i}]", item, facts)
        elif isinstance(item, list):
            r = _token_ids(f"{param}[{i}]", item, vocab, ctx)
        else:
            r = Refusal(400, f"{param}[{i}]", f"{param}[{i}]: got {_short(item)}; expected text or a list of token ids")
        if r:
            return r
    return None


def _model(body: dict, limits: OpsConfig, facts: ServingFacts) -> Optional[Refusal]:
    name = body.get("model")
    if name is None or limits.guard_allow_any_model or name in facts.model_names:
        return None
    served = ", ".join(repr(n) for n in facts.model_names[: facts.shown_names])
    return Refusal(404, "model", f"model: got {_short(name)}; this server serves {served}. "
                                 f"(--guard-allow-any-model true accepts any name)", code="model_not_found")


def _seed(param: str, v: Any, facts: ServingFacts) -> Optional[Refusal]:
    if v is None or facts.deterministic:
        return None
    return Refusal(400, param, f"{param}: got {_short(v)}; a per-request seed is honoured only when the server runs "
                               f"with --enable-deterministic-inference, and this one does not (the same seed would "
                               f"not give the same output). Drop '{param}' or restart the server with that flag")


def _n(param: str, v: Any, limits: OpsConfig) -> Optional[Refusal]:
    return _int_range(param, v, 1, limits.guard_max_n, " (raise the limit with --guard-max-n)")


def _logprobs(param: str, v: Any, limits: OpsConfig, vocab: Optional[int]) -> Optional[Refusal]:
    hi = limits.guard_max_top_logprobs if vocab is None else min(limits.guard_max_top_logprobs, vocab)
    return _int_range(param, v, 0, hi, " (raise the limit with --guard-max-top-logprobs)")


def _first(*checks) -> Optional[Refusal]:
    for c in checks:
        r = c()
        if r:
            return r
    return None


def pattern_limits(limits: OpsConfig) -> PatternLimits:
    return PatternLimits(max_pattern_bytes=int(limits.guard_max_pattern_kb * 1024),
                         allow_backtracking=limits.guard_allow_backtracking_stop_regex)


def _problem(p: Optional[PatternProblem]) -> Optional[Refusal]:
    return Refusal(400, p.param, p.message) if p else None


def _dict_field(param: str, v: Any) -> Optional[Refusal]:
    """An object-valued field (custom_params, chat_template_kwargs): an object, of bounded nesting
    (SGLang copies and serializes it recursively: 900 levels were a 500 with a RecursionError)."""
    if v is None:
        return None
    if not isinstance(v, dict):
        return Refusal(400, param, f"{param}: got {_short(v)}; expected a JSON object")
    if json_depth(v, JSON_DEPTH_LIMIT) > JSON_DEPTH_LIMIT:
        return Refusal(400, param, f"{param}: nested more than {JSON_DEPTH_LIMIT} levels deep; expected at most "
                                   f"{JSON_DEPTH_LIMIT}")
    return None


def _detokenize(body: dict, vocab: Optional[int]) -> Optional[Refusal]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        return None                                    # SGLang's schema check answers (a 400)
    rows = tokens if tokens and isinstance(tokens[0], list) else [tokens]
    for j, row in enumerate(rows):
        name = "tokens" if rows is not tokens else f"tokens[{j}]"
        if not isinstance(row, list):
            return Refusal(400, name, f"{name}: got {_short(row)}; expected a list of token ids")
        for i, t in enumerate(row):
            if not _is_int(t) or t < 0 or (vocab is not None and t >= vocab):
                rng = f"[0, {vocab})" if vocab is not None else ">= 0"
                return Refusal(400, f"{name}[{i}]", f"{name}[{i}]: got {_short(t)}; expected a token id in {rng} "
                                                    f"(the model's vocabulary)")
    return None


def check(path: str, body: Any, limits: OpsConfig, facts: ServingFacts) -> Optional[Refusal]:
    """None if `body` (parsed JSON) may go to SGLang, else the Refusal to send."""
    if not isinstance(body, dict):
        return None                                    # not a JSON object: SGLang's own 400 (sanitized)
    vocab = facts.vocab_size
    if path in DETOKENIZE:
        return _detokenize(body, vocab)
    if path == COMPLETIONS:
        return _first(lambda: _model(body, limits, facts),
                      lambda: _prompt("prompt", body.get("prompt"), limits, vocab, facts),
                      lambda: _n("n", body.get("n"), limits),
                      lambda: _logprobs("logprobs", body.get("logprobs"), limits, vocab),
                      lambda: _int_range("max_tokens", body.get("max_tokens"), 1, None),
                      lambda: _seed("seed", body.get("seed"), facts),
                      lambda: _problem(check_openai_patterns(body, pattern_limits(limits))),
                      lambda: _dict_field("custom_params", body.get("custom_params")))
    if path == CHAT:
        msgs = body.get("messages")
        return _first(lambda: _model(body, limits, facts),
                      lambda: (Refusal(400, "messages", "messages: got an empty list; expected at least one message")
                               if isinstance(msgs, list) and not msgs else None),
                      lambda: _n("n", body.get("n"), limits),
                      lambda: _logprobs("top_logprobs", body.get("top_logprobs"), limits, vocab),
                      lambda: _int_range("max_tokens", body.get("max_tokens"), 1, None),
                      lambda: _int_range("max_completion_tokens", body.get("max_completion_tokens"), 1, None),
                      lambda: _seed("seed", body.get("seed"), facts),
                      lambda: _problem(check_openai_patterns(body, pattern_limits(limits))),
                      lambda: _dict_field("custom_params", body.get("custom_params")),
                      lambda: _dict_field("chat_template_kwargs", body.get("chat_template_kwargs")))
    if path == GENERATE:
        return check_generate_fields(body, limits, facts)
    return None


def _batch_size(body: dict) -> Optional[int]:
    """Prompts in a /generate body (None: a single prompt)."""
    for key in ("text", "input_ids", "input_embeds"):
        v = body.get(key)
        if isinstance(v, str) or v is None:
            continue
        if isinstance(v, list) and v and isinstance(v[0], (list, str)):
            if key == "input_embeds" and not isinstance(v[0][0] if v[0] else None, list):
                return None                            # one prompt: a list of embedding rows
            return len(v)
        return None
    return None


def check_generate_fields(body: dict, limits: OpsConfig, facts: ServingFacts) -> Optional[Refusal]:
    """The /generate rules on a /generate body, or on a ``GenerateReqInput``'s fields (text,
    input_ids, input_embeds, sampling_params, top_logprobs_num) as every route hands them to the
    tokenizer manager."""
    vocab = facts.vocab_size
    for key in ("text", "input_ids"):
        if body.get(key) is not None:
            r = _prompt(key, body[key], limits, vocab, facts)
            if r:
                return r
    emb = body.get("input_embeds")
    if isinstance(emb, list) and (not emb or any(isinstance(e, list) and not e for e in emb)):
        return Refusal(400, "input_embeds", "input_embeds: got an empty list; expected one embedding row (a list "
                                            "of numbers) per prompt token")
    sp = body.get("sampling_params")
    sps = sp if isinstance(sp, list) else [sp] if isinstance(sp, dict) else []
    if sp is not None and not isinstance(sp, (dict, list)):
        return Refusal(400, "sampling_params", f"sampling_params: got {_short(sp)}; expected an object, or a list "
                                               f"of objects (one per prompt)")
    if len(sps) > limits.guard_max_batch:
        return Refusal(400, "sampling_params", f"sampling_params: got {len(sps)} entries; expected at most "
                                               f"{limits.guard_max_batch} (raise with --guard-max-batch)")
    if isinstance(sp, list):
        batch = _batch_size(body)
        if batch is None or len(sp) != batch:
            want = "one object (a single prompt)" if batch is None else f"{batch} (one per prompt)"
            return Refusal(400, "sampling_params", f"sampling_params: got a list of {len(sp)}; expected {want}")
    plimits = pattern_limits(limits)
    for i, p in enumerate(sps):
        name = "sampling_params" if isinstance(sp, dict) else f"sampling_params[{i}]"
        if not isinstance(p, dict):
            return Refusal(400, name, f"{name}: got {_short(p)}; expected an object")
        r = _first(lambda: _n(f"{name}.n", p.get("n"), limits),
                   lambda: _int_range(f"{name}.max_new_tokens", p.get("max_new_tokens"), 0, None),
                   lambda: _seed(f"{name}.sampling_seed", p.get("sampling_seed"), facts),
                   lambda: _problem(check_sampling_patterns(f"{name}.", p, plimits)),
                   lambda: _dict_field(f"{name}.custom_params", p.get("custom_params")))
        if r:
            return r
    tl = body.get("top_logprobs_num")
    for i, v in enumerate(tl if isinstance(tl, list) else [tl]):
        r = _logprobs("top_logprobs_num" if not isinstance(tl, list) else f"top_logprobs_num[{i}]", v, limits, vocab)
        if r:
            return r
    return None
