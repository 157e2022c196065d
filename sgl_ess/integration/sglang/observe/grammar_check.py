"""A grammar that admits no output is refused with a 400, not served into a 500 (issue 38, item 3).

AFTER hook on ``BaseGrammarBackend._init_value_dispatch`` (targets.GRAMMAR_COMPILE), which SGLang
runs in its grammar-compile thread pool, not on the scheduler's loop. SGLang 0.5.23 compiles an
EBNF such as ``root ::= root`` (no finite string) without complaint; the first step's mask then
allows no token, the sampler picks one anyway, ``accept_token`` fails and the request ends with a
500 "Grammar accept_token failed". Here a freshly compiled grammar whose start allows no token and
which is not already complete becomes SGLang's own ``InvalidGrammarObject``, the path its compile
errors take: the client gets a 400 naming the problem. Only for the xgrammar backend's objects
(a ``matcher``); the mask is the backend's own.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sgl_ess.patterns")


def after_init_value_dispatch(result, backend=None, key=None, *args, **kwargs):
    if result is None or getattr(result, "matcher", None) is None:
        return result
    try:
        if result.is_terminated():
            return result
        mask = result.allocate_vocab_mask(result.vocab_size, 1, "cpu")
        mask.zero_()
        result.fill_vocab_mask(mask, 0)
        if bool(mask.any()):
            return result
    except Exception:  # noqa: BLE001 - the check must never break a grammar SGLang accepted
        logger.exception("grammar check")
        return result
    from sglang.srt.constrained.base_grammar_backend import InvalidGrammarObject

    kind = key[0] if isinstance(key, tuple) and key else "grammar"
    logger.info("refused a %s grammar that allows no token at its start", kind)
    return InvalidGrammarObject(f"the {kind} grammar admits no output: no token can start it (is every rule "
                                f"able to end in text?)")


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.GRAMMAR_COMPILE, after_init_value_dispatch, HookType.AFTER)
