"""DeepSeek-V4 window-only layers on CPU: their (unused off NPU) ``rotary_emb``.

``MQALayer.__init__`` (models/deepseek_v4.py:1395) builds ``rotary_emb`` with ``get_rope_wrapper``;
on a CPU device SGLang's ``get_rope_cpu`` asserts a rope_scaling (factory.py:478), which window-only
layers (compress_ratio 0) do not pass. Off NPU the model never calls this module (its RoPE is
``freqs_cis``), so without CUDA, for the V4 model's call only, a call without rope_scaling builds
SGLang's plain ``get_rope`` table instead (the same RoPE, unscaled).
"""

from __future__ import annotations


def around_get_rope_wrapper(original_fn, *args, **kwargs):
    if kwargs.get("device") == "cpu" and kwargs.get("rope_scaling") is None:
        from sglang.srt.layers.rotary_embedding import get_rope

        kwargs = dict(kwargs)
        kwargs.pop("device")
        return get_rope(*args, **kwargs)
    return original_fn(*args, **kwargs)
