"""sgl-ess's TokenizerManager: SGLang's own, plus admission after tokenization and the crash handler.

Plugged in through official seams: ``http_server.launch_server(init_tokenizer_manager_func=...)``
-> ``engine.init_tokenizer_manager(TokenizerManagerClass=EssTokenizerManager)``. No patch.

``_validate_one_request`` (SGLang's per-request check, called for every tokenized request on
every route, batches included) is extended, not replaced: after SGLang's own checks, the request
must have at least one token, ids inside the vocabulary, and fit the token pool (with ESS on, the
host pool) at all (``sgl_ess.serving.admission``), by the node's PD role (a prefill node judges the
prompt only; a decode node also SGLang's reserved decode tokens). A refusal is a ValueError, which
SGLang turns into a 400 before anything is sent to the scheduler (on a decode node: before bootstrap).

``generate_request`` (the one entry of every generate route -- /generate, /v1/*, /invocations,
/vertex_generate, Ollama, any method) first applies the request guard's rules
(``sgl_ess.serving.request_rules``: ``n``, ``top_logprobs_num``, batch size, token ids) to the
request object itself, so no route or HTTP method can walk around them.

``_tokenize_texts``: a text that cannot fit the context (``sgl_ess.serving.prompt_bound``: at least
ceil(characters / the most characters one token covers) tokens) is refused before it is tokenized;
a prompt longer than ``OFF_LOOP_CHARS`` is tokenized in a worker thread, so one huge prompt does
not stall every other client on the HTTP event loop.

``sigterm_watchdog``: the bounded drain of shutdown.py (``--ess-drain-timeout-s``), then SGLang's
own exit path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from sglang.srt.entrypoints.engine import init_tokenizer_manager as _sglang_init_tokenizer_manager
from sglang.srt.managers.tokenizer_manager import TokenizerManager

from sgl_ess.config import config_from_env
from sgl_ess.serving.admission import refuse_reason
from sgl_ess.serving.ops_config import ops_from_env
from sgl_ess.serving.prompt_bound import max_chars_from_tokenizer, prompt_too_long
from sgl_ess.serving.request_rules import ServingFacts, check_generate_fields

from ..launcher import crash_handler, shutdown
from .status_route import ENV_POOL_SIZING

logger = logging.getLogger("sgl_ess.admission")
_DEFAULT_MAX_NEW_TOKENS = 128   # SGLang's SamplingParams default when the key is absent
OFF_LOOP_CHARS = 64 * 1024      # longer prompts are tokenized off the event loop
_RULE_FIELDS = ("text", "input_ids", "input_embeds", "sampling_params", "top_logprobs_num")


def _pool_tokens() -> int | None:
    from sglang.srt.entrypoints import http_server

    state = http_server.get_global_state()
    info = getattr(state, "scheduler_info", None) or {}
    return info.get("max_total_num_tokens")


class EssTokenizerManager(TokenizerManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.signal_handler_class = crash_handler.EssSignalHandler
        cfg = config_from_env()
        self._ess_on = bool(cfg and cfg.enabled)
        sizing = json.loads(os.environ.get(ENV_POOL_SIZING) or "{}")
        # the pool's page size as the launcher resolved it (DSA: 64); SGLang's resolved value lives
        # in the scheduler, and this process's server_args may still hold the unresolved default
        self._page_size = int(sizing.get("page_size") or self.server_args.page_size or 1)
        self._ops = ops_from_env()
        mode = str(getattr(self.server_args, "disaggregation_mode", "null") or "null")
        self._role = mode if mode in ("prefill", "decode") else "colocated"
        self._reserved_decode = int(getattr(self.server_args, "num_reserved_decode_tokens", 0) or 0)
        self.ess_max_chars_per_token = None                    # None: prompts judged after tokenization only
        self._ess_truncates = bool(getattr(self.server_args, "allow_auto_truncate", False))
        if self.tokenizer is not None and not self._ess_truncates:
            self.ess_max_chars_per_token, why = max_chars_from_tokenizer(self.tokenizer)
            logger.info("prompt length before tokenization: %s (%s)", f"at most {self.ess_max_chars_per_token} "
                        f"characters per token" if self.ess_max_chars_per_token else "not bounded", why)

    def ess_facts(self, model_names=(), deterministic=None) -> ServingFacts:
        """What the guard's rules need, from this tokenizer manager."""
        return ServingFacts(vocab_size=getattr(self.model_config, "vocab_size", None), model_names=tuple(model_names),
                            deterministic=self._ops.enable_deterministic_inference if deterministic is None
                            else deterministic,
                            context_len=None if self._ess_truncates else getattr(self, "context_len", None),
                            max_chars_per_token=self.ess_max_chars_per_token)

    def _rule_refusal(self, obj):
        """The guard's field rules on the request object, whatever route or method built it."""
        if not hasattr(obj, "return_logprob"):
            return None                                          # embeddings: no sampling fields
        facts = self.ess_facts()
        fields = {k: getattr(obj, k, None) for k in _RULE_FIELDS}
        return check_generate_fields(fields, self._ops, facts)

    async def generate_request(self, obj, request=None):
        refusal = self._rule_refusal(obj)
        if refusal is not None:
            logger.info("guard: refused in the tokenizer manager: %s", refusal.message)
            raise ValueError(refusal.message)
        async for out in super().generate_request(obj, request):
            yield out

    async def _tokenize_texts(self, texts, is_cross_encoder: bool = False):
        parts = [texts] if isinstance(texts, str) else texts if isinstance(texts, list) else []
        for t in parts:                                   # every route's text, before it is tokenized
            why = isinstance(t, str) and self.ess_max_chars_per_token and prompt_too_long(
                len(t), getattr(self, "context_len", None), self.ess_max_chars_per_token)
            if why:
                logger.info("admission: refused before tokenization: %s", why)
                raise ValueError(f"The input {why}")
        size = sum(len(t) for t in parts if isinstance(t, str))
        if size < OFF_LOOP_CHARS or self.async_dynamic_batch_tokenizer is not None:
            return await super()._tokenize_texts(texts, is_cross_encoder)
        parent = super()._tokenize_texts                  # no awaits inside without the async tokenizer
        return await asyncio.to_thread(lambda: asyncio.run(parent(texts, is_cross_encoder)))

    async def sigterm_watchdog(self):
        await shutdown.drain(self, self._ops.ess_drain_timeout_s)
        await super().sigterm_watchdog()

    def _validate_one_request(self, obj, input_ids) -> None:
        super()._validate_one_request(obj, input_ids)
        sp = getattr(obj, "sampling_params", None) or {}
        is_generation = hasattr(obj, "return_logprob")
        max_new = sp.get("max_new_tokens", _DEFAULT_MAX_NEW_TOKENS) if is_generation else 0
        pool = _pool_tokens()
        ids = list(input_ids) if input_ids is not None else []
        reason = refuse_reason(
            prompt_tokens=len(ids), max_new_tokens=max_new if isinstance(max_new, int) else None,
            pool_tokens=pool if pool else 1 << 62, page_size=self._page_size,
            ess_on=self._ess_on, vocab_size=getattr(self.model_config, "vocab_size", None), token_ids=ids,
            role=self._role, reserved_decode_tokens=self._reserved_decode)
        if reason:
            logger.info("admission: refused: %s", reason)
            raise ValueError(reason)


def init_tokenizer_manager(server_args, port_args, TokenizerManagerClass=None):
    return _sglang_init_tokenizer_manager(server_args, port_args, TokenizerManagerClass or EssTokenizerManager)
