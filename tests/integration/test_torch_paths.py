"""The CPU torch paths the plugin adds, against plain references (no server)."""

import math

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.ess_backend import sparse_mla  # noqa: E402
from sgl_ess.integration.sglang.backends.indexer_torch import act_quant, hadamard_rotate  # noqa: E402


def test_hadamard_is_orthonormal_and_matches_recursive_definition():
    x = torch.randn(5, 128)
    y = hadamard_rotate(x)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)
    # H_2n = [[H, H], [H, -H]] / sqrt(2)
    a, b = x[:, :64], x[:, 64:]
    ref = torch.cat([hadamard_rotate(a) + hadamard_rotate(b), hadamard_rotate(a) - hadamard_rotate(b)], -1) / math.sqrt(2)
    assert torch.allclose(y, ref, atol=1e-5)


def test_act_quant_roundtrip_within_fp8_precision():
    x = torch.randn(7, 3, 256) * 5
    q, s = act_quant(x, None)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (7, 3, 2)
    back = (q.float().view(7, 3, 2, 128) * s.unsqueeze(-1)).view(7, 3, 256)
    assert (back - x).abs().max() <= x.abs().max() * 0.07
    _, s2 = act_quant(x, "ue8m0")
    assert torch.equal(torch.exp2(torch.log2(s2).round()), s2)  # power-of-two scales


def test_sparse_mla_over_all_positions_equals_dense_attention():
    t, h, d, v, k = 4, 3, 24, 16, 10
    q = torch.randn(t, h, d)
    rows = torch.randn(t, k, d)
    valid = torch.ones(t, k, dtype=torch.bool)
    valid[0, 7:] = False
    out = sparse_mla(q, rows, valid, v, 0.3)
    for i in range(t):
        kv = rows[i][valid[i]]
        ref = torch.softmax(q[i] @ kv.T * 0.3, -1) @ kv[:, :v]
        assert torch.allclose(out[i], ref, atol=1e-5)


def test_dense_topk_positions_is_causal_per_query():
    from sgl_ess.integration.sglang.backends.ess_backend import dense_topk_positions

    got = dense_topk_positions([3, 5], [2, 1], "cpu")
    want = torch.tensor([[0, 1, -1, -1, -1],      # request 0, query at position 1
                         [0, 1, 2, -1, -1],       # request 0, query at position 2
                         [0, 1, 2, 3, 4]],        # request 1, query at position 4
                        dtype=torch.int32)
    assert torch.equal(got, want)
    assert dense_topk_positions([], [], "cpu").shape == (0, 0)
