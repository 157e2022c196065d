import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.attention.reference import (attend, dense_topk_reference, merge_lse, sparse_mla_decode,
                                         split_sparse_mla_decode)


def _naive(q, kv, r, scale):
    """Per (request, head) softmax attention by the textbook formula, float64."""
    out = torch.zeros(q.shape[0], q.shape[1], r, dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = (kv[b].double() @ q[b, h].double()) * scale
            p = torch.softmax(s, 0)
            out[b, h] = p @ kv[b][:, :r].double()
    return out


def test_sparse_decode_over_slot_table_equals_dense_selection():
    g = torch.Generator().manual_seed(0)
    lay = LatentLayout("fp32", 32, 8)
    b, h, k, S = 3, 4, 10, 50
    latents = torch.randn(S, 40, generator=g)
    rows = lay.encode(latents)
    slots = torch.stack([torch.randperm(S, generator=g)[:k] for _ in range(b)])
    slots[1, 7:] = -1
    q = torch.randn(b, h, 40, generator=g)
    out, lse = sparse_mla_decode(q, rows, slots, lay, 0.17)
    for i in range(b):
        sel = slots[i][slots[i] >= 0]
        want = _naive(q[i:i + 1], latents[sel].unsqueeze(0), 32, 0.17)
        torch.testing.assert_close(out[i:i + 1].double(), want, rtol=1e-5, atol=1e-6)
    ref_out, ref_lse = dense_topk_reference(q, [latents] * b, slots, 32, 0.17)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-5, atol=1e-6)


def test_split_attention_merged_by_lse_equals_full():
    g = torch.Generator().manual_seed(1)
    lay = LatentLayout("fp8_flashmla", 128, 16)
    b, h, k, S = 4, 8, 24, 60
    rows = lay.encode(torch.randn(S, 144, generator=g))
    slots = torch.stack([torch.randperm(S, generator=g)[:k] for _ in range(b)])
    slots[2, 20:] = -1
    hit = torch.rand((b, k), generator=g) < 0.7
    hit[3] = True   # all hits: Attn1 is empty
    hit[0] = False  # all misses: Attn0 is empty
    q = torch.randn(b, h, 144, generator=g)
    full = sparse_mla_decode(q, rows, slots, lay, 0.1)
    split = split_sparse_mla_decode(q, rows, slots, hit, lay, 0.1)
    torch.testing.assert_close(split[0], full[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(split[1], full[1], rtol=1e-5, atol=1e-6)


def test_merge_of_empty_parts():
    o = torch.randn(2, 3, 4)
    lse = torch.randn(2, 3)
    empty_o, empty_l = torch.zeros(2, 3, 4), torch.full((2, 3), float("-inf"))
    m, l = merge_lse(o, lse, empty_o, empty_l)
    torch.testing.assert_close(m, o)
    torch.testing.assert_close(l, lse)
    out, l2 = attend(torch.randn(1, 2, 5), torch.randn(1, 3, 5), torch.zeros(1, 3, dtype=torch.bool), 4, 1.0)
    assert torch.equal(out, torch.zeros(1, 2, 4)) and bool(torch.isinf(l2).all())
