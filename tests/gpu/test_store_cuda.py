"""CUDA checks of the store: the Triton FlashTrans kernel reading/writing pinned host memory
zero-copy, and the resolver on the GPU against the CPU oracle. Skipped without CUDA."""
import pytest
import torch

from sgl_ess.core.lru_oracle import LruOracle
from sgl_ess.kernels.flashtrans import copy_rows
from sgl_ess.store.hot_buffer import DeviceHotBuffer
from sgl_ess.store.resolver import assign

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("row_bytes", [656, 1152, 20])
def test_triton_zero_copy_host_to_device_and_back(row_bytes):
    g = torch.Generator().manual_seed(0)
    host = torch.randint(0, 256, (5000, row_bytes), generator=g, dtype=torch.uint8).pin_memory()
    dev = torch.zeros((800, row_bytes), dtype=torch.uint8, device="cuda")
    src = torch.randint(-1, 5000, (700,), generator=g)
    dst = torch.randperm(800, generator=g)[:700]
    copy_rows(host, src.cuda(), dev, dst.cuda(), backend="triton")
    torch.cuda.synchronize()
    want = torch.zeros((800, row_bytes), dtype=torch.uint8)
    keep = src >= 0
    want[dst[keep]] = host[src[keep]]
    assert torch.equal(dev.cpu(), want)
    # device -> host (write-back) through the same kernel
    host2 = torch.zeros_like(host).pin_memory()
    copy_rows(dev, dst.cuda(), host2, src.cuda(), backend="triton")
    torch.cuda.synchronize()
    assert torch.equal(host2[src[keep]], want[dst[keep]])


def test_resolver_on_cuda_matches_oracle():
    g = torch.Generator().manual_seed(1)
    b, k, n, ctx = 8, 64, 200, 5000
    buf = DeviceHotBuffer(1, b, n, "cuda")
    rows = torch.arange(b, device="cuda")
    lens = torch.full((b,), ctx, device="cuda")
    oracles = [LruOracle(n) for _ in range(b)]
    for _ in range(20):
        topk = torch.stack([torch.randperm(ctx, generator=g)[:k] for _ in range(b)])
        a = assign(buf, 0, rows, lens, topk.cuda())
        miss = a.miss.cpu()
        for i in range(b):
            want = oracles[i].access(topk[i].tolist())
            assert sorted(topk[i][miss[i]].tolist()) == sorted(want.misses)
