"""Child process (TRITON_INTERPRET=1): the Triton sparse MLA decode with learnable attention sinks
(Hunyuan V4) against sgl_ess.attention.sink_reference (written from the model's definition), and
the mutation: the same kernel with the sink dropped is outside the tolerance. Run by
test_sparse_mla_triton_sink.py.

Tolerance: the sink is one more softmax entry whose score is sink_h and whose value is 0, so the
fp32 bound of attention_bounds.decode_bounds applies to the attention over the selected rows plus
that entry (an extra key row holding 0 in the value columns, scored sink_h by an extra query
column); derived from the arithmetic, never from an observed error."""
import torch

from sgl_ess.attention.reference import merge_lse, with_sink
from sgl_ess.attention.sink_reference import sink_attention
from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
from tests.unit.kernels.attention_bounds import decode_bounds
from tests.unit.kernels.interp_runner import report
from tests.unit.kernels.sparse_mla_cases import exact_case, generic_case

BLOCK_KV = 16


def sinks_for(case, seed):
    """Per-head sinks around the heads' typical log-sum-exp (weights of the sink ~ 0.1 .. 0.9)."""
    lay, q, rows, slots, sm = case
    kv = lay.decode(rows[slots.clamp(min=0).long()])
    keep = slots >= 0
    scores = torch.einsum("thd,tkd->thk", q.double(), kv.double()) * sm
    lse = torch.logsumexp(scores.masked_fill(~keep.unsqueeze(1), float("-inf")), dim=2)
    typical = lse[torch.isfinite(lse).all(dim=1)].mean(dim=0)
    g = torch.Generator().manual_seed(seed)
    return (typical + torch.rand(typical.shape, generator=g, dtype=torch.float64) * 4 - 2).float()


def reference(case, sink, mask=None):
    lay, q, rows, slots, sm = case
    keep = (slots >= 0) if mask is None else (slots >= 0) & mask
    kv = lay.decode(rows[slots.clamp(min=0).long()])
    return sink_attention(q, kv, keep, sink, lay.kv_lora_rank, sm), kv, keep


def tolerance(case, kv, keep, sink):
    """decode_bounds over the selected rows plus the sink entry (score sink_h, value 0)."""
    lay, q, rows, slots, sm = case
    t, h, d = q.shape
    q_aug = torch.cat([q.double(), (sink.double() / sm).view(1, h, 1).expand(t, h, 1)], dim=2)
    kv_aug = torch.cat([kv.double(), torch.zeros(t, kv.shape[1], 1, dtype=torch.float64)], dim=2)
    sink_row = torch.zeros(t, 1, d + 1, dtype=torch.float64)
    sink_row[..., d] = 1.0
    kv_aug = torch.cat([kv_aug, sink_row], dim=1)
    keep_aug = torch.cat([keep, keep.any(dim=1, keepdim=True)], dim=1)    # no rows: no sink either (out 0)
    scores = torch.einsum("thd,tkd->thk", q_aug, kv_aug) * sm
    lse = torch.logsumexp(scores.masked_fill(~keep_aug.unsqueeze(1), float("-inf")), dim=2)
    tol_o, _ = decode_bounds(q_aug, kv_aug, keep_aug, sm, lay.kv_lora_rank, lse, BLOCK_KV, exact_scores=False)
    return tol_o


def _err(got, want, tol):
    return float(((got.double() - want).abs() - tol).max())


def with_the_sink(case, seed):
    sink = sinks_for(case, seed)
    want, kv, keep = reference(case, sink)
    lay, q, rows, slots, sm = case
    got, lse = sparse_mla_decode_triton(q, rows, slots, lay, sm, sink=sink, block_kv=BLOCK_KV)
    tol = tolerance(case, kv, keep, sink)
    worst = _err(got, want, tol)
    assert worst <= 0, f"out with the sink exceeds the fp32 bound by {worst:.3e}"
    empty = ~keep.any(dim=1)
    assert bool((got[empty] == 0).all()) and bool(torch.isneginf(lse[empty]).all()), "nothing selected: out 0"
    # the same kernel with the sink dropped (the defect this guards against) is far outside the bound
    dropped, _ = sparse_mla_decode_triton(q, rows, slots, lay, sm, block_kv=BLOCK_KV)
    assert _err(dropped, want, tol) > 0, "dropping the sink stays within the bound: the check cannot fail"


def da_merge():
    """DA's two masked calls run WITHOUT the sink; merged by log-sum-exp, the sink added once
    (reference.with_sink) equals the reference. Counting it in both parts does not."""
    case = exact_case("fp8_flashmla", seed=7, t=4)
    lay, q, rows, slots, sm = case
    sink = sinks_for(case, 8)
    g = torch.Generator().manual_seed(9)
    hit = torch.rand(slots.shape, generator=g) < 0.6
    hit[2], hit[3] = True, False                     # all hits / all misses
    want, kv, keep = reference(case, sink)
    tol = tolerance(case, kv, keep, sink)
    o0, l0 = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=hit, block_kv=BLOCK_KV)
    o1, l1 = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=~hit, block_kv=BLOCK_KV)
    o, lse = merge_lse(o0, l0, o1, l1)
    got, _ = with_sink(o.double(), lse.double(), sink)
    # the merge of two fp32 parts: twice the bound of one part (each within it of the exact result)
    worst = _err(got, want, 2 * tol)
    assert worst <= 0, f"DA merge + sink exceeds the bound by {worst:.3e}"
    s0, sl0 = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=hit, sink=sink, block_kv=BLOCK_KV)
    s1, sl1 = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=~hit, sink=sink, block_kv=BLOCK_KV)
    twice, _ = merge_lse(s0.double(), sl0.double(), s1.double(), sl1.double())
    assert _err(twice, want, 2 * tol) > 0, "a sink counted in both DA parts stays within the bound"


if __name__ == "__main__":
    report("sink:fp8_flashmla", lambda: with_the_sink(exact_case("fp8_flashmla", seed=11, h=20), 1))
    report("sink:bf16", lambda: with_the_sink(exact_case("bf16", seed=12), 2))
    report("sink_generic:bf16", lambda: with_the_sink(generic_case("bf16", seed=13), 3))
    report("sink_da_merge", da_merge)
