"""The ``ess`` backend (CPU) serves Hunyuan V4's learnable sinks in each of its attention kernels, checked
against sgl_ess.attention.sink_reference (the model's definition), each also run with the sink dropped
(the model without sinks), which must differ: a whole ESS-off decode forward (sinks read from the model),
prefill, MTP verify's gathered rows, the slot space, and StoreForward's choice of how the decode gets it
(a single-call kernel takes it itself; otherwise added once after the DA/DBA merge)."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.attention.overlap import SinkAttend  # noqa: E402
from sgl_ess.attention.sink_reference import sink_attention  # noqa: E402
from sgl_ess.integration.sglang.backends.ess_backend import EssSparseAttnBackend  # noqa: E402
from sgl_ess.integration.sglang.backends.store_forward import StoreForward  # noqa: E402

H, R, P = 4, 16, 8
D = R + P
SCALE = 0.2
TOKENS, REQS, CTX, K = 64, 3, 20, 8


class _Attn(torch.nn.Module):
    def __init__(self, layer_id, sink):
        super().__init__()
        self.learnable_sink_param = torch.nn.Parameter(sink)
        self.attn_mqa = SimpleNamespace(layer_id=layer_id)


def _setup(with_sinks: bool, seed=0):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(TOKENS, 1, D, generator=g, dtype=torch.float64)
    r2t = torch.randperm(TOKENS, generator=g)[:REQS * CTX].view(REQS, CTX).to(torch.int32)
    sink = torch.randn(H, generator=g, dtype=torch.float64) + 1.0
    model = torch.nn.Module()
    model.attn = _Attn(0, sink.clone()) if with_sinks else torch.nn.Module()
    runner = SimpleNamespace(device="cpu", req_to_token_pool=SimpleNamespace(req_to_token=r2t),
                             token_to_kv_pool=SimpleNamespace(get_key_buffer=lambda layer_id: cache),
                             model_config=SimpleNamespace(kv_lora_rank=R, qk_rope_head_dim=P), model=model)
    b = EssSparseAttnBackend(runner, ess=None)
    q = torch.randn(REQS, H * D, generator=g, dtype=torch.float64)
    topk = torch.stack([torch.randperm(CTX, generator=g)[:K] for _ in range(REQS)]).to(torch.int32)
    topk[1, K // 2:] = -1
    return b, cache, r2t, sink, q, topk


def _want(cache, r2t, sink, q, topk):
    rows = cache[:, 0][r2t[torch.arange(REQS)[:, None], topk.long().clamp(min=0)].long()]
    return sink_attention(q.view(REQS, H, D), rows, topk >= 0, sink, R, SCALE).view(REQS, H * R)


LAYER = SimpleNamespace(layer_id=0, tp_q_head_num=H, scaling=SCALE)


def _differs(a, b):
    return not torch.allclose(a, b)


def test_an_ess_off_decode_forward_reads_the_models_sink():
    b, cache, r2t, sink, q, topk = _setup(with_sinks=True)
    fb = SimpleNamespace(out_cache_loc=torch.zeros(REQS, dtype=torch.int64), seq_lens=torch.full((REQS,), CTX),
                         req_pool_indices=torch.arange(REQS))
    want = _want(cache, r2t, sink, q, topk)
    got = b.forward_decode(q, None, None, LAYER, fb, save_kv_cache=False, topk_indices=topk)
    torch.testing.assert_close(got, want)
    dropped, *_ = _setup(with_sinks=False)
    assert _differs(dropped.forward_decode(q, None, None, LAYER, fb, save_kv_cache=False, topk_indices=topk), want)


def test_prefill_and_gathered_and_slots_count_the_sink():
    b, cache, r2t, sink, q, topk = _setup(with_sinks=True)
    want = _want(cache, r2t, sink, q, topk)
    tok_req = torch.arange(REQS)
    torch.testing.assert_close(b.prefill(q, LAYER, None, topk, tok_req, None, sink=sink), want)
    assert _differs(b.prefill(q, LAYER, None, topk, tok_req, None), want)
    rows = cache[:, 0][r2t[tok_req[:, None], topk.long().clamp(min=0)].long()]
    torch.testing.assert_close(b.gathered(q, LAYER, rows, topk >= 0, sink=sink), want)
    assert _differs(b.gathered(q, LAYER, rows, topk >= 0), want)
    # the slot space: uint8 rows viewed in the cache dtype (pool_adapter.as_latent)
    b.ess = SimpleNamespace(as_latent=lambda slot_rows: slot_rows.view(torch.float64).view(-1, D))
    slot_rows = cache[:, 0].contiguous().view(torch.uint8)
    slots = torch.where(topk >= 0, r2t[tok_req[:, None], topk.long().clamp(min=0)], -1).to(torch.int32)
    out, _ = b.slots(q.view(REQS, H, D), LAYER, slot_rows, slots, sink=sink)
    torch.testing.assert_close(out.reshape(REQS, -1), want)
    out, _ = b.slots(q.view(REQS, H, D), LAYER, slot_rows, slots)
    assert _differs(out.reshape(REQS, -1), want)


class _Kernels:
    def __init__(self, single_call):
        self.single_call = single_call
        self.calls = []

    def slots(self, q3, layer, slot_rows, slots, **kw):
        self.calls.append(kw)
        return "out", "lse"


@pytest.mark.parametrize("single_call", [False, True])
def test_the_decode_gets_the_sink_once(single_call):
    k = _Kernels(single_call)
    sf = StoreForward(None, None, k, None, R, P)
    sink = torch.ones(H)
    attend = sf.attend_slots(LAYER, sink)
    attend("q", "rows", "slots")
    if single_call:      # FlashMLA returns no log-sum-exp: the kernel takes the sink
        assert not isinstance(attend, SinkAttend) and k.calls == [{"sink": sink}]
    else:                # partial attentions without it; overlap.attend_step adds it once after the merge
        assert isinstance(attend, SinkAttend) and attend.sink is sink and k.calls == [{}]
    k.calls.clear()
    sf.attend_slots(LAYER, None)("q", "rows", "slots")
    assert k.calls == [{}]
