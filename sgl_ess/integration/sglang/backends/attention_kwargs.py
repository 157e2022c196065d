"""Attention arguments ESS does not implement are refused, never dropped.

SGLang's attention call (``RadixAttention.forward`` -> ``AttentionBackend.forward_extend`` /
``forward_decode``) passes what a model's attention adds as keyword arguments: ``attn_sink``
(Hunyuan V4's learnable sinks), ``cos_sin_cache`` / ``is_neox`` / ``llama_4_scaling`` (rope fused into
TRT-LLM MLA), ``return_lse``, ... A backend that takes ``**kwargs`` and ignores them computes a
different attention than the model defines, silently. Both ESS backends (``ess`` on CPU and the CUDA
class when ESS is on) call ``refuse_unimplemented`` first: a keyword argument with a value (not None,
not False) that the backend does not implement raises NotImplementedError naming it. Both implement
``attn_sink`` (SINKS_IMPLEMENTED): the sink reaches every ESS attention path (store_forward.py).
Owns no state.
"""

from __future__ import annotations

INACTIVE = (None, False)          # a feature switched off: nothing to implement
ATTN_SINK = "attn_sink"           # learnable per-head sink logits (Hunyuan V4), float32 [H]
SINKS_IMPLEMENTED = frozenset({ATTN_SINK})


def refuse_unimplemented(kwargs: dict, backend: str, implemented: frozenset = frozenset()) -> None:
    """Raise NotImplementedError when `kwargs` (the attention call's extra keyword arguments) carry a
    value the `backend` does not implement (`implemented`: the names it does)."""
    extra = sorted(k for k, v in kwargs.items() if k not in implemented and not _inactive(v))
    if extra:
        got = ", ".join(f"{k}={_describe(kwargs[k])}" for k in extra)
        raise NotImplementedError(
            f"the {backend} attention backend got {got}: ESS does not implement "
            f"{'this attention feature' if len(extra) == 1 else 'these attention features'} and will not drop "
            f"{'it' if len(extra) == 1 else 'them'} silently (implemented: {sorted(implemented) or 'none'}). "
            "Serve this model with ESS off (--ess-enabled false) and an attention backend that implements it; "
            "the supported models are listed by sgl_ess.models.families")


def _inactive(value) -> bool:
    return any(value is v for v in INACTIVE)


def _describe(value) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"<{type(value).__name__} {tuple(shape)} {getattr(value, 'dtype', '')}>".replace(" >", ">")
    return repr(value)[:60]
