"""DeepSeek-V4 (``DeepseekV4ForCausalLM``) on CPU with ESS off: stand-ins for SGLang's CUDA-only calls
on one V4 layer's path (docs/dsv4.md), each installed only without CUDA and only at its call site."""

from __future__ import annotations

import os

import torch

from .. import targets


def register() -> None:
    if torch.cuda.is_available():
        return
    # the window row goes norm-rope (fused_norm_rope_inplace) -> attn_backend.store_cache, not the pool's
    # JIT CUDA fused store (MQALayer._compute_kv_to_cache, deepseek_v4.py:1835-1846)
    os.environ.setdefault("SGLANG_DSV4_USE_BF16_KV_QUANT_SOURCE", "1")
    # hyper-connections: SGLang's torch mixes and post instead of TileLang / DeepGEMM / FlashInfer kernels
    for flag in ("SGLANG_OPT_USE_TILELANG_MHC_PRE", "SGLANG_OPT_USE_TILELANG_MHC_POST",
                 "SGLANG_OPT_DEEPGEMM_HC_PRENORM", "SGLANG_OPT_USE_FLASHINFER_MHC"):
        os.environ.setdefault(flag, "0")
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .chat_encoding import around_build_chat_encoding_adapter
    from .draft_backends import around_draft_decode, around_draft_extend
    from .embed_head import around_set_embed_and_head
    from .hyper_connections import around_fused_hc_head, around_hc_split_sinkhorn, around_mhc_combine
    from .norm_rope import around_fused_norm_rope_inplace, around_fused_q_norm_rope, around_fused_rope_inplace
    from .pool_check import around_clear_unaccepted_c128, around_configure
    from .rope_table import around_get_rope_wrapper

    HookRegistry.register(targets.DSV4_GET_ROPE_WRAPPER, around_get_rope_wrapper, HookType.AROUND)
    HookRegistry.register(targets.DSV4_POOL_CONFIGURE, around_configure, HookType.AROUND)
    HookRegistry.register(targets.DSV4_CLEAR_C128_DRAFTS, around_clear_unaccepted_c128, HookType.AROUND)
    HookRegistry.register(targets.DSV4_Q_NORM_ROPE, around_fused_q_norm_rope, HookType.AROUND)
    HookRegistry.register(targets.DSV4_NORM_ROPE_INPLACE, around_fused_norm_rope_inplace, HookType.AROUND)
    HookRegistry.register(targets.DSV4_ROPE_INPLACE, around_fused_rope_inplace, HookType.AROUND)
    HookRegistry.register(targets.DSV4_HC_SPLIT_SINKHORN, around_hc_split_sinkhorn, HookType.AROUND)
    HookRegistry.register(targets.DSV4_MHC_COMBINE, around_mhc_combine, HookType.AROUND)
    HookRegistry.register(targets.DSV4_FUSED_HC_HEAD, around_fused_hc_head, HookType.AROUND)
    HookRegistry.register(targets.DSV4_SET_EMBED_AND_HEAD, around_set_embed_and_head, HookType.AROUND)
    HookRegistry.register(targets.DSV4_DRAFT_DECODE, around_draft_decode, HookType.AROUND)
    HookRegistry.register(targets.DSV4_DRAFT_EXTEND, around_draft_extend, HookType.AROUND)
    HookRegistry.register(targets.DSV4_CHAT_ADAPTER, around_build_chat_encoding_adapter, HookType.AROUND)
    from . import backend_factory

    backend_factory.register()
