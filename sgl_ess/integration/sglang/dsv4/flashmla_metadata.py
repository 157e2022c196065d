"""DeepSeek-V4 on CPU: no FlashMLA scheduler metadata.

``_create_flashmla_metadata`` (deepseek_v4_backend.py:210) imports ``flash_mla`` for a tile-scheduler
handle that only FlashMLA's ``flash_mla_with_kvcache`` reads; SGLang itself answers None where
FlashMLA does not run (sm120, XPU). Without CUDA the CPU dsv4 arm computes attention in torch, so
the call answers None too.
"""

from __future__ import annotations


def around_create_flashmla_metadata(original_fn, *args, **kwargs):
    return None
