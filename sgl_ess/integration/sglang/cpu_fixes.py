"""What SGLang 0.5.23 needs to run a DeepSeek-V3.2 (DSA) model without CUDA.

1. Argument resolution for DSA models asks ``torch.cuda.get_device_capability()``
   unconditionally (model_hook.handle_model_specific_adjustments and the DSA post-process
   passes it runs). On a machine without CUDA we answer (9, 0) *only during that call*;
   every other caller still sees the real torch function.
2. DeepSeek attention picks its forward method per backend name. The ``ess`` backend (and
   ``torch_native``) must take the absorbed-MLA path: the MHA prefill path would read a
   per-head K/V that the latent pool does not hold.
"""

from __future__ import annotations

import contextlib

import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import targets

_FAKE_CAPABILITY = (9, 0)


@contextlib.contextmanager
def fake_cuda_capability_without_cuda():
    """Within the block, ``torch.cuda.get_device_capability`` returns (9, 0) if CUDA is absent."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda device=None: _FAKE_CAPABILITY
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original


def _around_model_adjustments(original_fn, *args, **kwargs):
    with fake_cuda_capability_without_cuda():
        return original_fn(*args, **kwargs)


def _absorbed_mla(attn, forward_batch):
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    return AttnForwardMethod.MLA


def register() -> None:
    HookRegistry.register(targets.MODEL_SPECIFIC_ADJUSTMENTS, _around_model_adjustments, HookType.AROUND)
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    AttentionBackendRegistry.register(targets.ESS_BACKEND_NAME, _absorbed_mla)
    if not torch.cuda.is_available():
        AttentionBackendRegistry.register("torch_native", _absorbed_mla)
