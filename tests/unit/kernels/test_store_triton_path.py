"""The store's GPU code path (Triton resolver, Triton FlashTrans, Triton sparse decode) on this
CPU under TRITON_INTERPRET=1, in lockstep with the torch path: identical slot tables and slot
bytes, attention within the fp32 bound, for overlap levels none / da / dba; at none and da also
on the side-stream engine (Triton FlashTrans copy and move, streams completing late and out of
order: a GPU fake). (Real streams and zero-copy host views cannot run here: tests/gpu covers them.)"""
import pytest

from tests.unit.kernels.interp_runner import run_checks

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.store_triton_checks")


@pytest.mark.parametrize("mode", ["none", "da", "dba", "none:stream", "da:stream"])
def test_store_triton_path_matches_torch_path(results, mode):
    name = f"store_triton_path:{mode}"
    assert name in results, f"{name} did not run; ran: {sorted(results)}"
    assert results[name] == "OK", results[name]
