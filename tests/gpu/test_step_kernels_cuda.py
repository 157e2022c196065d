"""CUDA checks of the fused decode-step kernels at the paper's shapes (batch 64, k 2048, N 6400):
the plan epilogue (kernels/plan_epilogue_triton.py) against its torch reference on the GPU, entry
for entry and counter for counter, the scratch left zero, with the ring fitting and overflowing;
the commit move (copy + zero in one launch) and its row count. The same checks as
tests/unit/kernels/step_kernels_interp_checks.py, which run under the interpreter on the CPU.
Skipped without CUDA (tests/conftest.py)."""
import pytest

from tests.unit.kernels.step_kernels_interp_checks import epilogue_case, move_case

pytestmark = pytest.mark.gpu
pytest.importorskip("triton")

B, K, N, CTX, ROWS = 64, 2048, 6400, 32768, 80


@pytest.mark.parametrize("ring_cap", [B * K, 4096], ids=["ring_fits", "ring_overflows"])
def test_plan_epilogue_on_cuda_equals_its_torch_reference(ring_cap):
    got = epilogue_case(7, B, ring_cap, pad_rows=3, device="cuda", n_slots=N, k=K, rows=ROWS, ctx=CTX)
    assert got["in_ring"] == min(got["misses"], ring_cap) and got["misses"] > ring_cap * (ring_cap < B * K)


def test_move_rows_on_cuda_copies_zeroes_and_counts():
    assert move_case(8, device="cuda") == 10        # rows moved, as the kernel counted them
