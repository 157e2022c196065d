"""An attention feature ESS does not implement is an error, never a dropped keyword argument
(backends/attention_kwargs.py): SGLang's DeepSeek MLA forward hands Hunyuan V4's learnable sinks to
the backend as ``attn_sink``; both ESS backends took ``**kwargs`` and dropped it (both now implement it;
other features are still refused). The CUDA class is
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
def test_cpu_backend_refuses_an_unimplemented_feature_before_attending(phase):
    b = _backend()
    q = torch.zeros(2, H * (R + P))
    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H, scaling=1.0)
    call = getattr(b, phase)
    with pytest.raises(NotImplementedError, match="return_lse=True"):
        call(q, None, None, layer, _Batch(), save_kv_cache=False, topk_indices=torch.zeros(2, 4, dtype=torch.int32),
             return_lse=True)
    # a sink is implemented (tests/unit/models/test_ess_backend_sinks.py); without the refused feature the
    # same call goes on into the batch: the refusal above came from the check
    for extra in ({"attn_sink": torch.zeros(H)}, {}):
        with pytest.raises(_Reached):
            call(q, None, None, layer, _Batch(), save_kv_cache=False,
                 topk_indices=torch.zeros(2, 4, dtype=torch.int32), **extra)


class _SinkAttention(torch.nn.Module):
    def __init__(self, layer_id=None):
        super().__init__()
        self.learnable_sink_param = torch.nn.Parameter(torch.arange(H, dtype=torch.float32) + 10 * (layer_id or 0))
        if layer_id is not None:
            self.attn_mqa = SimpleNamespace(layer_id=layer_id)


def _model(*attns):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module() for _ in attns])
    for layer, attn in zip(model.layers, attns):
        layer.self_attn = attn
    return model


def test_the_backend_reads_each_layers_sink_from_the_model():
    """On CPU SGLang hands ``attn_sink`` only to its absorbed-core backends, so the ``ess`` backend reads
    the sinks from the model (HYV4Attention.learnable_sink_param, by its attn_mqa layer id)."""
    model = _model(_SinkAttention(0), _SinkAttention(1))
    b = _backend(model)
    assert sorted(b.sinks) == [0, 1]
    layer1 = SimpleNamespace(layer_id=1)
    assert b.sink(layer1, {}) is model.layers[1].self_attn.learnable_sink_param
    given = torch.ones(H)
    assert b.sink(layer1, {"attn_sink": given}) is given            # a passed attn_sink wins
    with pytest.raises(NotImplementedError, match="none for layer 2"):
        b.sink(SimpleNamespace(layer_id=2), {})                      # never silently without its sink
    assert _backend(_model(torch.nn.Module())).sink(layer1, {}) is None     # no sinks: none
    with pytest.raises(NotImplementedError, match=r"layers\.0\.self_attn \(_SinkAttention\).*layer id"):
        _backend(_model(_SinkAttention(None)))
