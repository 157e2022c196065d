"""EAGLE / MTP on CPU: the draft shares the target's embedding and LM head through
``DeepseekV4ForCausalLM.set_embed_and_head`` (models/deepseek_v4.py), which ends with
``torch.get_device_module().empty_cache()``; on CPU that module is ``torch.cpu``, which has no
``empty_cache`` (there is no cache to empty). For the call only, it gets one that does nothing."""

from __future__ import annotations

import torch


def around_set_embed_and_head(original_fn, *args, **kwargs):
    if hasattr(torch.cpu, "empty_cache"):
        return original_fn(*args, **kwargs)
    torch.cpu.empty_cache = lambda: None
    try:
        return original_fn(*args, **kwargs)
    finally:
        del torch.cpu.empty_cache
