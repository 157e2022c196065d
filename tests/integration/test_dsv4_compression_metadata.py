"""dsv4/compression_metadata.py (the CPU stand-in for the dsv4 backend's compression metadata) against
SGLang's own Triton kernel, init_compression_metadata (kernels/ops/attention/dsv4/metadata_kernel.py),
run here under TRITON_INTERPRET=1: every output tensor equal, on a batch with rows that finish a C4 and
a C128 block, rows that do not, and padding rows without a write location. Triton 3.4's interpreter cannot
run the kernel's C128 page-index loop (a tl.range over a runtime bound: "only 0-dimensional arrays can be
converted to Python scalars"), so the page indices are checked against a per-entry loop written from the
kernel's lines 123-147 instead."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration

SCRIPT = textwrap.dedent("""
    import torch
    from sglang.kernels.ops.attention.dsv4.metadata_kernel import init_compression_metadata
    from sgl_ess.integration.sglang.dsv4.compression_metadata import init_compression_metadata_torch
    seq_lens = torch.tensor([1, 4, 7, 128, 129, 256, 300, 512], dtype=torch.int32)
    positions = seq_lens - 1
    raw_out_loc = torch.tensor([5, 260, 519, 1151, 1280, 2047], dtype=torch.int64)   # 2 padding rows
    page_table = torch.tensor([[3, 1], [0, 2], [4, 5], [6, 7], [2, 3], [1, 0], [7, 4], [5, 6]], dtype=torch.int32)
    for pages in (False,):
        theirs = init_compression_metadata(seq_lens, positions, raw_out_loc, page_table, 256, compute_page_indices=pages)
        ours = init_compression_metadata_torch(seq_lens, positions, raw_out_loc, page_table, 256, compute_page_indices=pages)
        assert len(theirs) == len(ours) == 9
        for i, (a, b) in enumerate(zip(theirs, ours)):
            if a is None or b is None:
                assert a is None and b is None, i
                continue
            assert a.dtype == b.dtype and a.shape == b.shape, (i, a.dtype, b.dtype, a.shape, b.shape)
            assert torch.equal(a, b), (i, a, b)
    print("OK")
""")


def test_torch_metadata_equals_sglang_triton_kernel():
    pytest.importorskip("sglang")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout[-2000:] + out.stderr[-4000:]


def test_c128_page_indices_follow_the_kernel_definition():
    torch = pytest.importorskip("torch")
    from sgl_ess.integration.sglang.dsv4.compression_metadata import init_compression_metadata_torch

    seq_lens = torch.tensor([1, 128, 255, 256, 384, 512], dtype=torch.int32)
    page_table = torch.tensor([[3, 1], [0, 2], [4, 5], [6, 7], [2, 3], [1, 0]], dtype=torch.int32)
    out = init_compression_metadata_torch(seq_lens, seq_lens - 1, torch.arange(6), page_table, 256)
    pages = out[8]
    per_page, max_pages = 256 // 128, 2
    assert pages.dtype == torch.int32 and pages.shape == (6, per_page * max_pages)
    for b in range(6):
        for j in range(per_page * max_pages):
            want = int(page_table[b, j // per_page]) * per_page + j % per_page if j < int(seq_lens[b]) // 128 else -1
            assert int(pages[b, j]) == want, (b, j)
