"""The torch versions of sgl-kernel's EAGLE CPU ops (backends/eagle_cpu_kernels.py): each replaces a name that
exists in SGLang's CPU-engine modules, and computes what SGLang's Triton kernel of that name
computes (reference cases worked out by hand for a chain of draft tokens, topk 1)."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends import eagle_cpu_kernels as k  # noqa: E402
from sgl_ess.integration.sglang.targets import SPEC_CPU_OPS  # noqa: E402


def test_targets_exist_in_cpu_engine_modules():
    code = ("import pkgutil,sys\nfrom sgl_ess.integration.sglang.targets import SPEC_CPU_OPS\n"
            "for t in SPEC_CPU_OPS:\n    m, a = t.rsplit('.', 1)\n    getattr(pkgutil.resolve_name(m), a)\n"
            "print('ok', len(SPEC_CPU_OPS))")
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok 6" in r.stdout, r.stderr[-2000:]
    assert set(k.REPLACEMENTS) == {t.rsplit(".", 1)[1] for t in SPEC_CPU_OPS}


def test_cache_location_ops():
    r2t = torch.arange(30, dtype=torch.int32).view(3, 10) + 100
    out = torch.empty(2 * 4, dtype=torch.int64)
    k.assign_draft_cache_locs_contiguous_cpu(torch.tensor([2, 0]), r2t, torch.tensor([3, 5]), out, 10, 1, 4)
    assert out.tolist() == [123, 124, 125, 126, 105, 106, 107, 108]
    out = torch.empty(5, dtype=torch.int64)
    k.assign_extend_cache_locs_cpu(torch.tensor([1, 2]), r2t, torch.tensor([2, 7]), torch.tensor([4, 10]), out, 10)
    assert out.tolist() == [112, 113, 127, 128, 129]


def test_bonus_and_accepted_locations():
    accept = torch.tensor([[7, 8, -1, -1], [3, 4, 5, 6]])       # per request: accepted tokens (stride 4)
    bonus = torch.empty(2, dtype=torch.int32)
    k.fill_bonus_tokens_cpu(accept, torch.tensor([2, 4]), bonus, 4)
    assert bonus.tolist() == [8, 6]
    locs = torch.zeros(8, dtype=torch.int64)
    k.fill_accept_out_cache_loc_cpu(torch.tensor([0, 1, -1, -1, 4, 5, 6, -1]), torch.arange(8) + 50, locs)
    assert locs[:5].tolist() == [50, 51, 54, 55, 56]


def _chain_tree(bs=2, n=4, seq_lens=(10, 20)):
    parents = torch.tensor([[-1, 0, 1]] * bs)              # what EAGLE v2 passes for a topk-1 chain of 3 steps
    selected = torch.tensor([[0, 1, 2]] * bs)
    mask = torch.zeros(sum(seq_lens) * n + n * n * bs, dtype=torch.bool)
    pos = torch.empty(bs * n, dtype=torch.int64)
    ri, rnt, rns = (torch.full((bs, n), -1, dtype=torch.int64) for _ in range(3))
    k.build_tree_kernel_efficient_cpu(parents, selected, torch.tensor(seq_lens), mask, pos, ri, rnt, rns, 1, 3, n, 0)
    return mask, pos, ri, rnt, rns


def test_chain_tree_and_greedy_verify():
    mask, pos, ri, rnt, rns = _chain_tree()
    assert pos.tolist() == [10, 11, 12, 13, 20, 21, 22, 23]
    assert ri.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert rnt.tolist() == [[1, 2, 3, -1]] * 2 and rns.tolist() == [[-1] * 4] * 2
    # FULL_MASK: draft token x of request 0 sees the 10 prefix tokens and draft tokens 0..x
    row = lambda x: mask[(10 + 4) * x + 10:(10 + 4) * x + 14].tolist()  # noqa: E731
    assert [row(x) for x in range(4)] == [[True, False, False, False], [True, True, False, False],
                                           [True, True, True, False], [True, True, True, True]]
    candidates = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    target = torch.tensor([[6, 7, 9, 1], [2, 3, 4, 5]])   # request 0 accepts 2 drafts, request 1 none
    predicts = torch.zeros(8, dtype=torch.int64)
    accept = torch.full((2, 4), -1, dtype=torch.int64)
    num = torch.zeros(2, dtype=torch.int64)
    k.verify_tree_greedy_cpu(predicts, accept, num, candidates, ri, rnt, rns, target)
    assert num.tolist() == [2, 0]
    assert accept.tolist() == [[0, 1, 2, -1], [4, -1, -1, -1]]
    assert predicts.tolist() == [6, 7, 9, 0, 2, 0, 0, 0]
