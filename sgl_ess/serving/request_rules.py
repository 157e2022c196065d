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

COMPLETIONS, CHAT, GENERATE = "/v1/completions", "/v1/chat/completions", "/generate"
GUARDED_PATHS = (COMPLETIONS, CHAT, GENERATE)


@dataclass(frozen=True)
class ServingFacts:
    vocab_size: Optional[int]                 # None: unknown (ids are still checked after tokenization)
    model_names: tuple[str, ...]              # accepted values of "model" (the first ones are shown)
    deterministic: bool                       # --enable-deterministic-inference
    shown_names: int = 2                      # how many to name in a refusal (the rest may be paths)


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


def _token_ids(param: str, ids: list, vocab: Optional[int]) -> Optional[Refusal]:
    if len(ids) == 0:
        return Refusal(400, param, f"{param}: got an empty list of token ids; expected at least one token id")
    for i, t in enumerate(ids):
        if not _is_int(t):
            return Refusal(400, f"{param}[{i}]", f"{param}[{i}]: got {_short(t)}; expected an integer token id")
        if t < 0 or (vocab is not None and t >= vocab):
            rng = f"[0, {vocab})" if vocab is not None else ">= 0"
            return Refusal(400, f"{param}[{i}]", f"{param}[{i}]: got token id {t}; expected an id in {rng} "
                                                 f"(the model's vocabulary)")
    return None


def _text(param: str, s: str) -> Optional[Refusal]:
    if s == "":
        return Refusal(400, param, f"{param}: got an empty string; expected text of at least one token "
                                   f"(this tokenizer adds no start token, so empty text is zero tokens)")
    return None


def _prompt(param: str, p: Any, limits: OpsConfig, vocab: Optional[int]) -> Optional[Refusal]:
    """A completions 'prompt' / generate 'text' / 'input_ids': str | [str] | [int] | [[int]]."""
    if isinstance(p, str):
        return _text(param, p)
    if not isinstance(p, list):
        return None                                    # SGLang's own schema check answers (sanitized)
    if len(p) == 0:
        return Refusal(400, param, f"{param}: got an empty list; expected a prompt (text or token ids)")
    if all(_is_int(t) or isinstance(t, (float, bool)) for t in p):
        return _token_ids(param, p, vocab)            # one prompt given as token ids
    if len(p) > limits.guard_max_batch:
        return Refusal(400, param, f"{param}: got a batch of {len(p)} prompts; expected at most "
                                   f"{limits.guard_max_batch} (raise with --guard-max-batch)")
    for i, item in enumerate(p):
        if isinstance(item, str):
            r = _text(f"{param}[{i}]", item)
        elif isinstance(item, list):
            r = _token_ids(f"{param}[{i}]", item, vocab)
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


def check(path: str, body: Any, limits: OpsConfig, facts: ServingFacts) -> Optional[Refusal]:
    """None if `body` (parsed JSON) may go to SGLang, else the Refusal to send."""
    if not isinstance(body, dict):
        return None                                    # not a JSON object: SGLang's own 400 (sanitized)
    vocab = facts.vocab_size
    if path == COMPLETIONS:
        return _first(lambda: _model(body, limits, facts),
                      lambda: _prompt("prompt", body.get("prompt"), limits, vocab),
                      lambda: _n("n", body.get("n"), limits),
                      lambda: _logprobs("logprobs", body.get("logprobs"), limits, vocab),
                      lambda: _int_range("max_tokens", body.get("max_tokens"), 1, None),
                      lambda: _seed("seed", body.get("seed"), facts))
    if path == CHAT:
        msgs = body.get("messages")
        return _first(lambda: _model(body, limits, facts),
                      lambda: (Refusal(400, "messages", "messages: got an empty list; expected at least one message")
                               if isinstance(msgs, list) and not msgs else None),
                      lambda: _n("n", body.get("n"), limits),
                      lambda: _logprobs("top_logprobs", body.get("top_logprobs"), limits, vocab),
                      lambda: _int_range("max_tokens", body.get("max_tokens"), 1, None),
                      lambda: _int_range("max_completion_tokens", body.get("max_completion_tokens"), 1, None),
                      lambda: _seed("seed", body.get("seed"), facts))
    if path == GENERATE:
        return check_generate_fields(body, limits, facts)
    return None


def check_generate_fields(body: dict, limits: OpsConfig, facts: ServingFacts) -> Optional[Refusal]:
    """The /generate rules on a /generate body, or on a ``GenerateReqInput``'s fields (text,
    input_ids, sampling_params, top_logprobs_num) as every route hands them to the tokenizer manager."""
    vocab = facts.vocab_size
    for key in ("text", "input_ids"):
        if body.get(key) is not None:
            r = _prompt(key, body[key], limits, vocab)
            if r:
                return r
    sp = body.get("sampling_params")
    sps = sp if isinstance(sp, list) else [sp] if isinstance(sp, dict) else []
    if len(sps) > limits.guard_max_batch:
        return Refusal(400, "sampling_params", f"sampling_params: got {len(sps)} entries; expected at most "
                                               f"{limits.guard_max_batch} (raise with --guard-max-batch)")
    for i, p in enumerate(sps):
        name = "sampling_params" if isinstance(sp, dict) else f"sampling_params[{i}]"
        if not isinstance(p, dict):
            continue
        r = _first(lambda: _n(f"{name}.n", p.get("n"), limits),
                   lambda: _int_range(f"{name}.max_new_tokens", p.get("max_new_tokens"), 0, None),
                   lambda: _seed(f"{name}.sampling_seed", p.get("sampling_seed"), facts))
        if r:
            return r
    tl = body.get("top_logprobs_num")
    for i, v in enumerate(tl if isinstance(tl, list) else [tl]):
        r = _logprobs("top_logprobs_num" if not isinstance(tl, list) else f"top_logprobs_num[{i}]", v, limits, vocab)
        if r:
            return r
    return None
