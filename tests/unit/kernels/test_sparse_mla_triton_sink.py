"""The Triton sparse MLA decode with Hunyuan V4's learnable sinks, under TRITON_INTERPRET=1 (CPU),
against the reference written from the model's definition; each check also runs the mutation (the
sink dropped, or counted in both of DA's parts) and requires it to fail the same tolerance."""
import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from tests.unit.kernels.interp_runner import run_checks

pytest.importorskip("triton")

CHECKS = ["sink:fp8_flashmla", "sink:bf16", "sink_generic:bf16", "sink_da_merge"]


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.sparse_mla_sink_interp_checks")


@pytest.mark.parametrize("check", CHECKS)
def test_sink_decode_kernel_under_interpreter(results, check):
    assert check in results, f"{check} did not run; ran: {sorted(results)}"
    assert results[check] == "OK", results[check]


def test_a_sink_of_the_wrong_shape_is_named():
    from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
    lay = LatentLayout("bf16", 128, 64)
    rows = torch.zeros((4, lay.row_bytes), dtype=torch.uint8)
    with pytest.raises(ValueError, match="sink must be"):
        sparse_mla_decode_triton(torch.zeros(2, 3, 192), rows, torch.zeros(2, 4, dtype=torch.int32), lay, 0.1,
                                 sink=torch.zeros(5))
