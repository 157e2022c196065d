"""Child process (TRITON_INTERPRET=1): Triton FlashTrans against its torch reference on index tensors
that are strided views (issue 32, defect 2: SplitFetch passes ``grid[rank]``, a row of a transposed
[size, per] view, and the kernel read it as contiguous, shipping the wrong rows on CUDA). Also the
plan epilogue's in-place outputs (strided ones refused). Run by test_flashtrans_strided_index.py."""
import torch

from sgl_ess.kernels.flashtrans import copy_rows, move_rows
from tests.unit.kernels.interp_runner import report


def _strided(t: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    """t[i] for i % size == rank as SplitFetch forms it: a row of a transposed view (stride `size`)."""
    per = -(-t.numel() // size)
    pad = torch.cat([t, t.new_full((per * size - t.numel(),), -1)])
    view = pad.view(per, size).t()[rank]
    assert not view.is_contiguous() and view.stride() == (size,), view.stride()
    return view


def copy_case(seed: int, row_bytes: int, size: int = 4):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (64, row_bytes), dtype=torch.uint8, generator=g)
    for rank in range(size):
        si = _strided(torch.randint(-1, 64, (30,), generator=g), size, rank)
        di = _strided(torch.randperm(40, generator=g)[:30], size, rank)
        want = torch.zeros((40, row_bytes), dtype=torch.uint8)
        got = want.clone()
        cw, cg = (torch.zeros((), dtype=torch.int64) for _ in range(2))
        copy_rows(src, si, want, di, "torch", count=cw)
        copy_rows(src, si, got, di, "triton", count=cg)
        assert torch.equal(want, got), f"rank {rank}: triton copied other rows than torch"
        assert int(cw) == int(cg), (int(cw), int(cg))


def move_case(seed: int, size: int = 3):
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(1, 256, (48, 656), dtype=torch.uint8, generator=g)
    perm = torch.randperm(48, generator=g)
    for rank in range(size):
        si, di = _strided(perm[:18].clone(), size, rank), _strided(perm[18:36].clone(), size, rank)
        want, got = rows.clone(), rows.clone()
        move_rows(want, si, di, "torch")
        move_rows(got, si, di, "triton")
        assert torch.equal(want, got), f"rank {rank}: triton moved other rows than torch"


def split_fetch_exchange_case(seed: int, size: int = 4):
    """SplitFetch's own send-buffer gather (prefetch/split_fetch.py _exchange) with the Triton backend."""
    g = torch.Generator().manual_seed(seed)
    slots = torch.randint(0, 256, (50, 656), dtype=torch.uint8, generator=g)
    dst = torch.randperm(50, generator=g)[:21]
    dst[torch.rand(21, generator=g) < 0.2] = -1
    per = -(-dst.numel() // size)
    grid = torch.cat([dst, dst.new_full((per * size - dst.numel(),), -1)]).view(per, size).t()
    rows = torch.arange(per)
    for rank in range(size):
        sends = []
        for backend in ("torch", "triton"):
            send = torch.zeros((per, 656), dtype=torch.uint8)
            copy_rows(slots, grid[rank], send, torch.where(grid[rank] >= 0, rows, -1), backend)
            sends.append(send)
        assert torch.equal(*sends), f"rank {rank}: the send buffer differs between torch and triton"


def epilogue_refuses_strided_counters():
    """The plan epilogue adds into its counter rows in place: a strided row (a column of the counters)
    is refused, not written at the wrong addresses."""
    from sgl_ess.kernels.plan_epilogue_triton import plan_epilogue_triton
    from tests.unit.kernels.step_kernels_interp_checks import resolver_like

    b, n, k, r = 2, 8, 6, 4
    slots, miss, hit, tokens = resolver_like(torch.Generator().manual_seed(5), b, n_slots=n, k=k, ctx=32)
    counts = torch.zeros((r, 3), dtype=torch.int64)
    args = (slots, miss, hit, tokens, torch.arange(b), torch.arange(b), torch.arange(r * 32).view(r, 32),
            torch.zeros((b, n + 1), dtype=torch.int32))
    kw = dict(hot_base=0, n_slots=n, ring_first=100, ring_cap=4, layer_counts=torch.zeros(3, dtype=torch.int64))
    try:
        plan_epilogue_triton(*args, hits_row=counts[:, 0], misses_row=counts[:, 1].clone(), **kw)
    except ValueError as e:
        assert "hits_row must be contiguous" in str(e), e
    else:
        raise AssertionError("a strided hits_row was accepted")


if __name__ == "__main__":
    report("copy_rows:strided_656", lambda: copy_case(1, 656))
    report("copy_rows:strided_7", lambda: copy_case(2, 7))
    report("move_rows:strided", lambda: move_case(3))
    report("split_fetch:send_buffer", lambda: split_fetch_exchange_case(4))
    report("plan_epilogue:strided_counters_refused", epilogue_refuses_strided_counters)
