"""The CPU shim's murmur_hash32_cpu (launch/cpu_shims/sgl_kernel) equals MurmurHash3 computed in
plain Python: SGLang's seeded sampling on CPU depends on it."""

import pytest
import torch

M = 0xFFFFFFFF


def _rotl(x, r):
    return ((x << r) | (x >> (32 - r))) & M


def _mix(h, k):
    k = (k * 0xCC9E2D51) & M
    k = _rotl(k, 15)
    k = (k * 0x1B873593) & M
    h ^= k
    h = _rotl(h, 13)
    return (h * 5 + 0xE6546B64) & M


def _ref(seed, pos, col):
    h = 0
    for k in (seed & M, (seed >> 32) & M, pos & M, col & M):
        h = _mix(h, k)
    h ^= 16
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M
    return h ^ (h >> 16)


def test_murmur_hash32_cpu_matches_reference():
    pytest.importorskip("sgl_kernel")
    if not hasattr(torch.ops.sgl_kernel, "murmur_hash32_cpu"):
        pytest.fail("sgl_kernel shim lacks murmur_hash32_cpu: re-run bash launch/setup.sh")
    seeds = [0, 42, 2**40 + 7, 2**64 - 5]          # the last: a negative seed seen as uint64
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 2**31, (len(seeds),), generator=g)
    cols = torch.arange(37)
    got = torch.ops.sgl_kernel.murmur_hash32_cpu(torch.tensor(seeds, dtype=torch.uint64), pos, cols)
    want = [[_ref(s, int(p), c) for c in range(37)] for s, p in zip(seeds, pos.tolist())]
    assert got.dtype == torch.uint32 and got.to(torch.int64).tolist() == want
