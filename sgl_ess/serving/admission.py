"""Admission that knows the token pool: refuse at once what can never run.

With ESS on, SGLang's token pool IS the ESS host pool (every latent row of every request lives
there; the device holds only hot buffers), so a request needs host rows for its whole prompt and
every token it may generate. SGLang 0.5.23 admits a request only while
``extend + min(max_new_tokens, 4096) + page_size < free + evictable`` (schedule_policy /
prefill_budget): one that cannot pass even on an idle, empty pool waits forever, blocking the
queue behind it, and one that passes only with its output clipped comes back "finished" with
fewer tokens than asked. Both are refused here, with the numbers.

``max_new_tokens`` None (chat without max_tokens) is bounded by what is free; such a request is
refused only if even its first token cannot fit.

The role matters in a prefill/decode split (issue 18):
  * ``prefill``: the node holds only the prompt until its KV is sent (SGLang sets the request's
    ``max_new_tokens`` to 1 there), so the output length is no rule of its pool: the decode node
    judges it. A prefill node refuses only a prompt its pool can never hold.
  * ``decode``: the node holds the whole request, and SGLang's decode pre-allocation admits a
    request only with ``--num-reserved-decode-tokens`` (512) decode tokens free beyond its prompt,
    whatever its ``max_new_tokens``; one that cannot pass on an idle pool would wait in the
    pre-allocation queue forever, its prompt held on the prefill node. Refused here, before
    bootstrap, with the numbers.
"""

from __future__ import annotations

from typing import Optional


ROLES = ("colocated", "prefill", "decode")


def pool_tokens_needed(prompt_tokens: int, max_new_tokens: Optional[int], page_size: int,
                       role: str = "colocated", reserved_decode_tokens: int = 0) -> int:
    """Token rows a request holds at its end on a node of `role`, plus the one page SGLang reserves
    per request."""
    new = 1 if max_new_tokens is None else max_new_tokens
    if role == "prefill":
        new = 1
    elif role == "decode":
        new = max(new, reserved_decode_tokens)
    return prompt_tokens + new + page_size


def refuse_reason(prompt_tokens: int, max_new_tokens: Optional[int], pool_tokens: int, page_size: int,
                  ess_on: bool, vocab_size: Optional[int] = None, token_ids=None, role: str = "colocated",
                  reserved_decode_tokens: int = 0) -> Optional[str]:
    """None if the request can run on an idle server, else the sentence to send (a 400)."""
    if prompt_tokens == 0:
        return ("the prompt has no tokens (empty text: this tokenizer adds no start token); "
                "send at least one token")
    if token_ids is not None and vocab_size is not None:
        for i, t in enumerate(token_ids):
            if t < 0 or t >= vocab_size:
                return f"input token {i} is {t}; expected an id in [0, {vocab_size}) (the model's vocabulary)"
    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    need = pool_tokens_needed(prompt_tokens, max_new_tokens, page_size, role, reserved_decode_tokens)
    if need < pool_tokens:
        return None
    pool = "host pool (ESS)" if ess_on else "KV pool"
    flag = "--ess-memory-pool-size-gb or --max-total-tokens" if ess_on else "--max-total-tokens"
    room = pool_tokens - prompt_tokens - page_size - 1
    asked = "max_new_tokens unset (at least 1)" if max_new_tokens is None else f"max_new_tokens {max_new_tokens}"
    floor = 1                                               # the fewest new tokens the node must hold
    if role == "prefill":
        asked = "1 token (a prefill node holds the prompt and the first token only)"
        room = -1                                           # only a shorter prompt helps
    elif role == "decode" and (max_new_tokens is None or max_new_tokens < reserved_decode_tokens):
        asked = (f"{reserved_decode_tokens} reserved decode tokens (SGLang's decode pre-allocation keeps "
                 f"--num-reserved-decode-tokens free beyond the prompt, whatever max_new_tokens asks)")
        room, floor = -1, reserved_decode_tokens            # only a shorter prompt (or a smaller reserve) helps
    if role == "decode":
        pool = f"decode node's {pool}"
    fix = (f"lower max_tokens / max_new_tokens to at most {room}" if room >= 1
           else f"shorten the prompt below {pool_tokens - page_size - floor} tokens")
    return (f"request can never fit the {pool}: prompt {prompt_tokens} tokens + {asked} + one {page_size}-token "
            f"page = {need} token rows, but the pool holds {pool_tokens} (including every other request). "
            f"{fix[0].upper() + fix[1:]}, or restart the server with a larger {flag}")
