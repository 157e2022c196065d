"""The Triton resolver kernel under TRITON_INTERPRET=1 (CPU): every scenario against the LRU
oracle step by step, in lockstep with the torch path (identical slots, flags, slot_to_token,
lru_order; token map cleared), and alternating kernel/torch steps on one buffer."""
import pytest

from tests.unit.kernels.interp_runner import run_checks
from tests.unit.kernels.lru_scenarios import SCENARIOS

pytest.importorskip("triton")

CHECKS = [f"lockstep:{n}" for n in sorted(SCENARIOS)] + \
    [f"alternating:{n}" for n in ("fast_to_slow", "padded_rows")]


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.resolver_interp_checks")


@pytest.mark.parametrize("check", CHECKS)
def test_resolver_kernel_under_interpreter(results, check):
    assert check in results, f"{check} did not run; ran: {sorted(results)}"
    assert results[check] == "OK", results[check]
