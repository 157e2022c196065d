"""sgl-ess's TokenizerManager: SGLang's own, plus admission after tokenization and the crash handler.

Plugged in through official seams: ``http_server.launch_server(init_tokenizer_manager_func=...)``
-> ``engine.init_tokenizer_manager(TokenizerManagerClass=EssTokenizerManager)``. No patch.

``_validate_one_request`` (SGLang's per-request check, called for every tokenized request on
every route, batches included) is extended, not replaced: after SGLang's own checks, the request
must have at least one token, ids inside the vocabulary, and fit the token pool (with ESS on, the
host pool) at all (``sgl_ess.serving.admission``). A refusal is a ValueError, which SGLang turns
into a 400 before anything is sent to the scheduler.
"""

from __future__ import annotations

import json
import logging
import os

from sglang.srt.entrypoints.engine import init_tokenizer_manager as _sglang_init_tokenizer_manager
from sglang.srt.managers.tokenizer_manager import TokenizerManager

from sgl_ess.config import config_from_env
from sgl_ess.serving.admission import refuse_reason

from . import crash_handler
from .status_route import ENV_POOL_SIZING

logger = logging.getLogger("sgl_ess.admission")
_DEFAULT_MAX_NEW_TOKENS = 128   # SGLang's SamplingParams default when the key is absent


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
            ess_on=self._ess_on, vocab_size=getattr(self.model_config, "vocab_size", None), token_ids=ids)
        if reason:
            logger.info("admission: refused: %s", reason)
            raise ValueError(reason)


def init_tokenizer_manager(server_args, port_args, TokenizerManagerClass=None):
    return _sglang_init_tokenizer_manager(server_args, port_args, TokenizerManagerClass or EssTokenizerManager)
