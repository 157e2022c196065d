"""An attention feature ESS does not implement is an error, never a dropped keyword argument
(backends/attention_kwargs.py): SGLang's DeepSeek MLA forward hands Hunyuan V4's learnable sinks to
the backend as ``attn_sink``; both ESS backends took ``**kwargs`` and dropped it. The CUDA class is
checked in tests/integration/test_attention_kwargs_cuda.py (GPU fake)."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.attention_kwargs import refuse_unimplemented  # noqa: E402
from sgl_ess.integration.sglang.backends.ess_backend import EssSparseAttnBackend  # noqa: E402

H, R, P = 4, 64, 16


def test_a_sink_is_refused_and_named():
    sink = torch.zeros(H, dtype=torch.float32)
    with pytest.raises(NotImplementedError, match=r"attn_sink=<Tensor \(4,\) torch.float32>.*--ess-enabled false"):
        refuse_unimplemented({"attn_sink": sink}, "ess")


def test_switched_off_features_and_implemented_names_pass():
    refuse_unimplemented({"attn_sink": None, "return_lse": False}, "ess")
    refuse_unimplemented({"q_rope": torch.zeros(1)}, "x", implemented=frozenset({"q_rope"}))
    with pytest.raises(NotImplementedError, match="return_lse=True"):
        refuse_unimplemented({"return_lse": True}, "ess")


class _Runner(SimpleNamespace):
    pass


def _backend(model=None):
    runner = _Runner(device="cpu", req_to_token_pool=None, token_to_kv_pool=None,
                     model_config=SimpleNamespace(kv_lora_rank=R, qk_rope_head_dim=P))
    if model is not None:
        runner.model = model
    return EssSparseAttnBackend(runner, ess=None)


class _Reached(Exception):
    """Raised by the batch below when the backend reads it: the forward went past the kwargs check."""


class _Batch:
    def __getattr__(self, name):
        raise _Reached(name)


@pytest.mark.parametrize("phase", ["forward_extend", "forward_decode"])
def test_cpu_backend_refuses_a_sink_before_attending(phase):
    b = _backend()
    q = torch.zeros(2, H * (R + P))
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H, scaling=1.0)
    call = getattr(b, phase)
    with pytest.raises(NotImplementedError, match="attn_sink"):
        call(q, None, None, layer, _Batch(), save_kv_cache=False, topk_indices=torch.zeros(2, 4, dtype=torch.int32),
             attn_sink=torch.zeros(H))
    # without the sink the same call goes on into the batch: the refusal above came from the check
    with pytest.raises(_Reached):
        call(q, None, None, layer, _Batch(), save_kv_cache=False, topk_indices=torch.zeros(2, 4, dtype=torch.int32))


class _SinkAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.learnable_sink_param = torch.nn.Parameter(torch.zeros(H))


def test_a_model_with_learnable_sinks_is_refused_when_the_backend_is_built():
    """On CPU SGLang hands ``attn_sink`` only to its absorbed-core backends, so the ``ess`` backend would
    never see it: the model itself is checked (HYV4Attention.learnable_sink_param)."""
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].self_attn = _SinkAttention()
    with pytest.raises(NotImplementedError, match=r"layers\.0\.self_attn \(_SinkAttention\).*sinks"):
        _backend(model)
    model.layers[0].self_attn.learnable_sink_param = None
    _backend(model)
