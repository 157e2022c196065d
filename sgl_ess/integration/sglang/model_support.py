"""Is this model one ESS serves? The model's config read with SGLang's own helpers into
``ModelFacts``, decided by the model table (sgl_ess/models/families.py).

Called by the launcher where it reads the model's config (launcher/model_config.py), with ESS on,
before anything loads: a model outside the table stops the launch with exit 2 (PreflightError).
Owns no state.
"""

from __future__ import annotations

import logging

from sgl_ess.models.families import (LINEAR_ATTENTION, SHARED_TOPK, SINKS, ModelFacts, attention_layers, family_of,
                                      refusal)
from sgl_ess.serving.preflight import PreflightError

logger = logging.getLogger("sgl_ess")


def facts_of(cfg) -> ModelFacts:
    """ModelFacts from a transformers config (its text config for a multimodal one), through SGLang
    0.5.23's srt/configs/model_config.py: is_deepseek_dsa, dsa_layer_skips_topk, uses_kda_attention."""
    from sglang.srt.configs.model_config import dsa_layer_skips_topk, is_deepseek_dsa, uses_kda_attention

    archs = list(getattr(cfg, "architectures", None) or [])
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    arch = archs[0] if archs else "(no architectures in config.json)"
    adds = set()
    is_dsa = bool(archs) and (is_deepseek_dsa(cfg) or is_deepseek_dsa(text))
    if is_dsa:
        dsa_cfg = cfg if is_deepseek_dsa(cfg) else text
        # attention layer ids, as dsa_layer_skips_topk numbers them (LongCat: 2 per decoder layer)
        layers = attention_layers(arch, int(getattr(text, "num_hidden_layers", 0) or 0))
        if any(dsa_layer_skips_topk(dsa_cfg, i) for i in range(layers)):
            adds.add(SHARED_TOPK)
    if uses_kda_attention(cfg):
        adds.add(LINEAR_ATTENTION)
    return ModelFacts(architecture=arch, model_type=str(getattr(cfg, "model_type", "") or ""), is_dsa=is_dsa,
                      adds=frozenset(adds))


V4_ARCH = "DeepseekV4ForCausalLM"


def v4_on_cpu(facts: ModelFacts) -> bool:
    """DeepSeek-V4 without CUDA: ESS on runs its C4 layers' entries through ESS's host store on the CPU dsv4
    arm (integration/sglang/dsv4/ess_setup.py, which refuses draft trees, PD, graphs and several ranks); on
    CUDA ESS does not serve V4 yet."""
    if facts.architecture != V4_ARCH:
        return False
    import torch

    return not torch.cuda.is_available()


def check(cfg) -> None:
    """Raise PreflightError (exit 2) when ESS does not serve the model of `cfg`."""
    facts = facts_of(cfg)
    if v4_on_cpu(facts):
        logger.info("ESS on for DeepSeek-V4 (CPU dsv4 arm): its C4 layers' compressed entries in ESS's host store, "
                    "fetched through per-request hot buffers (exact LRU); window rows and C128 entries stay in the "
                    "arm's rows; MTP with chain drafts. Refused with ESS on: draft trees (--speculative-eagle-topk > 1), "
                    "PD, graphs, TP/DP/PP > 1")
        return
    text = refusal(facts)
    if text and facts.architecture == V4_ARCH:
        from sgl_ess.sim.dsv4 import config_summary
        text += ". " + config_summary((cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg).to_dict())
    if text:
        raise PreflightError(text)
    fam = family_of(facts.architecture)
    if SHARED_TOPK in facts.adds:
        logger.info("%s: shared-index layers (reusing the previous layer's top-k): ESS resolves each group's LRU "
                    "once per step at its anchor layer and plans every layer's fetch there (with "
                    "--speculative-algorithm each layer keeps its own LRU instead: pools/pool_adapter.store_anchors)",
                    facts.architecture)
    logger.info("ESS model family: %s (%s)", fam.name if fam else "?", facts.architecture)


def check_no_sinks(model) -> None:
    """Runtime guard, for a model loaded without the launcher's check: no attention module of `model`
    (an nn.Module) carries a learnable sink (HYV4Attention.learnable_sink_param), which SGLang's
    DeepSeek MLA forward hands only to the absorbed-core backends as ``attn_sink``. Raises
    NotImplementedError naming the module."""
    for name, mod in model.named_modules():
        if getattr(mod, "learnable_sink_param", None) is not None:
            raise NotImplementedError(
                f"{name} ({type(mod).__name__}) has learnable attention sinks ({SINKS}): the ess attention "
                "backend does not implement them and would drop them silently. Serve this model with another "
                "attention backend and ESS off (--ess-enabled false --attention-backend ...)")
