"""The model's geometry (layers, latent row bytes, index_topk) read before anything loads, through
transformers' own config loader: ``AutoConfig.from_pretrained`` takes a local directory or a hub id,
and reads a hub id from the local HF cache (``HF_HOME``) when it is there, or only from it with
``HF_HUB_OFFLINE=1`` - as SGLang itself will when it loads the model. A family whose decoder layer
holds several attention layers (LongCat-Flash) is then re-read through SGLang's own get_config, whose
layer count differs from transformers' class. A config that cannot be read stops the launch (exit 2)
with what was tried and what fixes it. Owns no state.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

from sgl_ess.serving.preflight import ModelGeometry, PreflightError

logger = logging.getLogger("sgl_ess")


def load_geometry(model: str, trust_remote_code: bool = False, revision: Optional[str] = None):
    """The latent geometry of `model` (a ModelGeometry; for DeepSeek-V4 a v4_plan.V4Model; None: the config
    has no MLA latent, so no ESS sizing applies). Raises PreflightError when the config cannot be read."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, revision=revision)
    except (OSError, ValueError, KeyError) as e:      # not found / offline and not cached / unknown model_type
        raise PreflightError(_unreadable(model, e)) from None
    cfg = _as_sglang_reads_it(model, cfg, trust_remote_code, revision)
    from ..model_support import check as check_model_supported

    check_model_supported(cfg)          # the model table (models/families.py): outside it, exit 2 before loading
    if "DeepseekV4ForCausalLM" in (getattr(cfg, "architectures", None) or []):
        return v4_model_of(cfg)          # no DSA latent pool: sized by v4_plan.py
    return geometry_of(cfg)


def v4_model_of(cfg):
    """A DeepSeek-V4 config as v4_plan.py sizes it: its text config's keys and SGLang's context length."""
    from sglang.srt.utils.hf_transformers.common import get_context_length

    from .v4_plan import V4Model

    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    return V4Model(config=text.to_dict(), context_len=get_context_length(text))


def _as_sglang_reads_it(model: str, cfg, trust_remote_code: bool, revision: Optional[str]):
    """`cfg`, or for a family whose decoder layer holds several attention layers (LongCat-Flash) the
    config SGLang itself loads (its get_config, which re-reads it through SGLang's own class): there
    transformers and SGLang disagree on num_hidden_layers (transformers' LongcatFlashConfig derives it
    as 2 x num_layers, SGLang's keeps the decoder layers and counts 2 x that in num_attention_layers),
    and the pool SGLang builds follows SGLang's."""
    from sgl_ess.models.families import family_of

    fam = family_of((list(getattr(cfg, "architectures", None) or []) or [""])[0])
    if fam is None or fam.attention_sublayers == 1:
        return cfg
    from sglang.srt.utils.hf_transformers.config import get_config

    try:
        return get_config(model, trust_remote_code=trust_remote_code, revision=revision)
    except (OSError, ValueError, KeyError) as e:
        raise PreflightError(_unreadable(model, e)) from None


def geometry_of(cfg) -> Optional[ModelGeometry]:
    """ModelGeometry from a model config (its text config for a multimodal one), as SGLang reads it
    (_as_sglang_reads_it). `layers`: the latent (attention) layers, as SGLang's
    ModelConfig.num_attention_layers counts them (LongCat-Flash: 2 x num_hidden_layers;
    models/families.attention_layers)."""
    from sgl_ess.models.families import attention_layers

    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    try:
        r, p = int(text.kv_lora_rank), int(text.qk_rope_head_dim)
        arch = (list(getattr(cfg, "architectures", None) or []) or [""])[0]
        layers = attention_layers(arch, int(text.num_hidden_layers))
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
