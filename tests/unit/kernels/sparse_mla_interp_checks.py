"""Child process (TRITON_INTERPRET=1): the Triton sparse MLA decode against the torch reference
for every layout, with tolerances from attention_bounds.py. Run by test_sparse_mla_triton.py."""
import torch

from sgl_ess.attention.reference import merge_lse, sparse_mla_decode
from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
from tests.unit.kernels.attention_bounds import decode_bounds, merge_bounds
from tests.unit.kernels.interp_runner import report
from tests.unit.kernels.sparse_mla_cases import exact_case, generic_case

BLOCK_KV = 16


def _within(got, want, tol, what):
    fin = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), fin), f"{what}: finite pattern differs"
    if got.shape == want.shape and not bool(fin.all()):
        assert bool((got[~fin] == want[~fin]).all()), f"{what}: non-finite values differ"
    err = (got.double() - want.double()).abs().where(fin, torch.zeros((), dtype=torch.float64))
    worst = float((err - tol).max())
    assert worst <= 0, f"{what}: error exceeds the fp32 bound by {worst:.3e} (max err {float(err.max()):.3e})"


def _bounds(lay, q, rows, slots, keep, sm_scale, lse, exact):
    kv = lay.decode(rows[slots.clamp(min=0).long()])
    return decode_bounds(q.float(), kv, keep, sm_scale, lay.kv_lora_rank, lse, BLOCK_KV, exact)


def check(case, exact, mask=None):
    lay, q, rows, slots, sm = case
    want_o, want_l = sparse_mla_decode(q, rows, slots, lay, sm, mask=mask)
    got_o, got_l = sparse_mla_decode_triton(q, rows, slots, lay, sm, mask=mask, block_kv=BLOCK_KV)
    keep = (slots >= 0) if mask is None else (slots >= 0) & mask
    tol_o, tol_l = _bounds(lay, q, rows, slots, keep, sm, want_l, exact)
    _within(got_l, want_l, tol_l, "lse")
    _within(got_o, want_o, tol_o, "out")
    empty = ~keep.any(dim=1)
    assert bool((got_o[empty] == 0).all()), "a token with nothing selected must give out = 0"
    return got_o, got_l, tol_o, tol_l


def nothing_selected():
    lay, q, rows, slots, sm = exact_case("fp8_flashmla", seed=4)
    slots[0] = -1                                   # padding only
    mask = torch.ones_like(slots, dtype=torch.bool)
    mask[2] = False                                 # masked away entirely
    o, l, _, _ = check((lay, q, rows, slots, sm), exact=True, mask=mask)
    assert bool(torch.isneginf(l[0]).all()) and bool(torch.isneginf(l[2]).all())
    assert bool(torch.isfinite(l[1]).all())


def da_split():
    lay, q, rows, slots, sm = exact_case("fp8_flashmla", seed=5, t=4)
    g = torch.Generator().manual_seed(6)
    hit = torch.rand(slots.shape, generator=g) < 0.7
    hit[2] = True                                   # all hits: Attn1 empty
    hit[3] = False                                  # all misses: Attn0 empty
    o0, l0, t_o0, t_l0 = check((lay, q, rows, slots, sm), exact=True, mask=hit)
    o1, l1, t_o1, t_l1 = check((lay, q, rows, slots, sm), exact=True, mask=~hit)
    merged_o, merged_l = merge_lse(o0, l0, o1, l1)
    want_o, want_l = sparse_mla_decode(q, rows, slots, lay, sm)
    v_max = lay.decode(rows).abs()[:, :lay.kv_lora_rank].max().double().expand(slots.shape[0], 1)
    tol_o, tol_l = merge_bounds(t_o0, t_l0, t_o1, t_l1, v_max, want_l)
    _within(merged_l, want_l, tol_l, "merged lse")
    _within(merged_o, want_o, tol_o, "merged out")


if __name__ == "__main__":
    for kind in ("fp32", "bf16", "fp8_flashmla"):
        report(f"exact:{kind}", lambda: check(exact_case(kind, h=20 if kind == "fp8_flashmla" else 5), True))
    for kind in ("bf16", "fp8_flashmla"):
        report(f"exact_bf16_q:{kind}", lambda: check(exact_case(kind, seed=2, q_dtype=torch.bfloat16), True))
        report(f"generic:{kind}", lambda: check(generic_case(kind), False))
    report("nothing_selected", nothing_selected)
    report("da_split", da_split)
