"""The store's fused step kernels (plan epilogue, commit move) under TRITON_INTERPRET=1 against
their torch references, in a child process (step_kernels_interp_checks.py)."""
import pytest

from tests.unit.kernels.interp_runner import run_checks

pytest.importorskip("triton")

CHECKS = ["plan_epilogue:ring_fits", "plan_epilogue:ring_overflows", "plan_epilogue:padding_rows",
          "plan_epilogue:one_row", "plan_epilogue:no_ring", "move_rows"]


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.step_kernels_interp_checks")


@pytest.mark.parametrize("name", CHECKS)
def test_step_kernel_matches_its_torch_reference(results, name):
    assert name in results, f"{name} did not run; ran: {sorted(results)}"
    assert results[name] == "OK", results[name]
