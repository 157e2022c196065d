"""The model's geometry (layers, latent row bytes, index_topk) read before anything loads, through
transformers' own config loader: ``AutoConfig.from_pretrained`` takes a local directory or a hub id,
and reads a hub id from the local HF cache (``HF_HOME``) when it is there, or only from it with
``HF_HUB_OFFLINE=1`` - as SGLang itself will when it loads the model. A config that cannot be read
stops the launch (exit 2) with what was tried and what fixes it. Owns no state.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from sgl_ess.serving.preflight import ModelGeometry, PreflightError

logger = logging.getLogger("sgl_ess")


def load_geometry(model: str, trust_remote_code: bool = False, revision: Optional[str] = None
                  ) -> Optional[ModelGeometry]:
    """The latent geometry of `model` (None: the config has no MLA latent, so no ESS sizing applies).
    Raises PreflightError when the config cannot be read."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, revision=revision)
    except (OSError, ValueError, KeyError) as e:      # not found / offline and not cached / unknown model_type
        raise PreflightError(_unreadable(model, e)) from None
    from ..model_support import check as check_model_supported

    check_model_supported(cfg)          # the model table (models/families.py): outside it, exit 2 before loading
    return geometry_of(cfg)


def geometry_of(cfg) -> Optional[ModelGeometry]:
    """ModelGeometry from a transformers config (its text config for a multimodal one)."""
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    try:
        r, p = int(text.kv_lora_rank), int(text.qk_rope_head_dim)
        layers = int(text.num_hidden_layers)
    except (AttributeError, TypeError, ValueError):
        return None
    from sglang.srt.utils.hf_transformers.common import get_context_length

    return ModelGeometry(layers=layers, latent_row_bytes=(r + p) * 2, index_topk=getattr(text, "index_topk", None),
                         vocab_size=getattr(text, "vocab_size", None), kv_lora_rank=r, qk_rope_head_dim=p,
                         context_len=get_context_length(text))


def _unreadable(model: str, e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(".")
    local = os.path.isdir(model)
    where = (f"the directory {model}" if local else
             f"the hub id {model!r} (HF cache {os.environ.get('HF_HOME') or '~/.cache/huggingface'}, "
             f"HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', 'unset')})")
    fix = ("give --model-path a directory that holds the model's config.json" if local else
           f"download it first (hf download {model} config.json, or the whole model), then set HF_HUB_OFFLINE=1 "
           f"to read the local cache only; or pass a local directory with --model-path")
    return (f"--model-path {model}: cannot read the model's config through transformers.AutoConfig from {where}: "
            f"{first}. ESS sizes its host pool and hot buffers from it before the model loads; {fix}")
