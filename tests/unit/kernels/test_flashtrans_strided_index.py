"""Issue 32, defect 2: Triton FlashTrans agrees with its torch reference on strided index views (what
SplitFetch hands it), under TRITON_INTERPRET=1 in a child process (flashtrans_strided_checks.py)."""
import pytest

from tests.unit.kernels.interp_runner import run_checks

pytest.importorskip("triton")

CHECKS = ["copy_rows:strided_656", "copy_rows:strided_7", "move_rows:strided", "split_fetch:send_buffer",
          "plan_epilogue:strided_counters_refused"]


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.flashtrans_strided_checks")


@pytest.mark.parametrize("name", CHECKS)
def test_triton_flashtrans_matches_torch_on_strided_indices(results, name):
    assert name in results, f"{name} did not run; ran: {sorted(results)}"
    assert results[name] == "OK", results[name]
