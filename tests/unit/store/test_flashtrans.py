"""FlashTrans: the torch path against a plain loop, and the Triton kernel against the torch path
(under TRITON_INTERPRET=1 on this CPU machine; on a GPU in tests/gpu)."""
import os
import subprocess
import sys

import pytest
import torch

from sgl_ess.kernels.flashtrans import copy_rows, copy_rows_torch


def _case(seed, row_bytes, m=50):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (40, row_bytes), generator=g, dtype=torch.uint8)
    dst = torch.randint(0, 256, (30, row_bytes), generator=g, dtype=torch.uint8)
    src_idx = torch.randint(-1, 40, (m,), generator=g)
    dst_idx = torch.randperm(30, generator=g)[:m] if m <= 30 else torch.randint(0, 30, (m,), generator=g)
    dst_idx[torch.rand(m, generator=g) < 0.2] = -1
    return src, src_idx, dst, dst_idx


@pytest.mark.parametrize("row_bytes", [656, 1152, 20, 7])
def test_torch_path_matches_loop(row_bytes):
    src, si, dst, di = _case(0, row_bytes, m=25)
    want = dst.clone()
    for s, d in zip(si.tolist(), di.tolist()):
        if s >= 0 and d >= 0:
            want[d] = src[s]
    copy_rows_torch(src, si, dst, di)
    assert torch.equal(dst, want)


def test_bad_arguments_are_named():
    src = torch.zeros((4, 8), dtype=torch.uint8)
    with pytest.raises(ValueError, match="row_bytes differ"):
        copy_rows(src, torch.tensor([0]), torch.zeros((4, 9), dtype=torch.uint8), torch.tensor([0]))
    with pytest.raises(ValueError, match="int32/int64"):
        copy_rows(src, torch.tensor([0.0]), src.clone(), torch.tensor([0]))
    with pytest.raises(ValueError, match="backend"):
        copy_rows(src, torch.tensor([0]), src.clone(), torch.tensor([1]), backend="cuda-magic")


TRITON_CHECK = r"""
import torch
from sgl_ess.kernels.flashtrans import copy_rows
for seed, rb in [(1, 656), (2, 1152), (3, 20), (4, 7)]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (40, rb), generator=g, dtype=torch.uint8)
    dst = torch.randint(0, 256, (30, rb), generator=g, dtype=torch.uint8)
    si = torch.randint(-1, 40, (25,), generator=g)
    di = torch.randperm(30, generator=g)[:25]
    di[torch.rand(25, generator=g) < 0.2] = -1
    a, b = dst.clone(), dst.clone()
    copy_rows(src, si, a, di, backend="torch")
    copy_rows(src, si, b, di, backend="triton")
    assert torch.equal(a, b), rb
    # views into a layer-first buffer (non-zero storage offset), as the store passes them
    big = torch.randint(0, 256, (3, 40, rb), generator=g, dtype=torch.uint8)
    a, b = dst.clone(), dst.clone()
    copy_rows(big[2], si, a, di, backend="torch")
    copy_rows(big[2], si, b, di, backend="triton")
    assert torch.equal(a, b), rb
print("TRITON_OK")
"""


def test_triton_kernel_matches_torch_under_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", TRITON_CHECK], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "TRITON_OK" in r.stdout, r.stderr[-3000:]
