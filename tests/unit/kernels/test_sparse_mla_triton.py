"""The Triton sparse MLA decode kernel under TRITON_INTERPRET=1 (CPU) against the torch
reference: all three latent layouts, fp32 and bf16 queries, -1 padding, tokens with nothing
selected, and the DA split (two masked calls merged by log-sum-exp). Tolerances are the fp32
error bounds of attention_bounds.py, computed from each case's data."""
import pytest
import torch

from sgl_ess.kernels.latent_layout import LatentLayout
from tests.unit.kernels.interp_runner import run_checks

pytest.importorskip("triton")

CHECKS = ["exact:fp32", "exact:bf16", "exact:fp8_flashmla", "exact_bf16_q:bf16",
          "exact_bf16_q:fp8_flashmla", "generic:bf16", "generic:fp8_flashmla",
          "nothing_selected", "da_split"]


@pytest.fixture(scope="module")
def results():
    return run_checks("tests.unit.kernels.sparse_mla_interp_checks")


@pytest.mark.parametrize("check", CHECKS)
def test_sparse_decode_kernel_under_interpreter(results, check):
    assert check in results, f"{check} did not run; ran: {sorted(results)}"
    assert results[check] == "OK", results[check]


def test_bad_shapes_are_named():
    from sgl_ess.kernels.sparse_mla_triton import sparse_mla_decode_triton
    lay = LatentLayout("fp8_flashmla", 128, 64)
    rows = torch.zeros((4, lay.row_bytes), dtype=torch.uint8)
    with pytest.raises(ValueError, match="q must be"):
        sparse_mla_decode_triton(torch.zeros(2, 3, 100), rows, torch.zeros(2, 4, dtype=torch.int32), lay, 0.1)
    with pytest.raises(ValueError, match="rows must be"):
        sparse_mla_decode_triton(torch.zeros(2, 3, 192), rows[:, :10], torch.zeros(2, 4, dtype=torch.int32), lay, 0.1)
    with pytest.raises(ValueError, match="slots must be"):
        sparse_mla_decode_triton(torch.zeros(2, 3, 192), rows, torch.zeros(3, 4, dtype=torch.int32), lay, 0.1)
