"""Issue 17: what the launcher sets and refuses for multi-rank runs, and how padding rows are found
(no server: the pure parts of process_env, compat and padding)."""

import os
from types import SimpleNamespace

import pytest
import torch

from sgl_ess.integration.sglang.launcher import compat, process_env
from sgl_ess.integration.sglang.backends import padding


def test_cores_split_into_one_contiguous_group_per_rank():
    assert process_env.core_groups([0, 1], 2) == [[0], [1]]
    assert process_env.core_groups(list(range(10)), 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert process_env.core_groups([0, 1], 4) == [[0], [1], [0], [1]]       # fewer cores: shared
    assert process_env._spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.parametrize("tp,dp,pp,dpa,nnodes,want", [
    (2, 1, 1, False, 1, 2), (2, 2, 1, True, 1, 2), (1, 2, 1, False, 1, 2), (4, 1, 1, False, 2, 2),
    (8, 8, 1, True, 1, 8), (1, 1, 1, False, 1, 1)])
def test_ranks_on_this_node(tp, dp, pp, dpa, nnodes, want):
    assert process_env.ranks_on_this_node(tp, dp, pp, dpa, nnodes) == want


def test_bind_is_set_for_multi_rank_cpu_runs_only(monkeypatch):
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    args = SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, enable_dp_attention=False, nnodes=1)
    assert process_env.bind_cpu_threads(args, has_cuda=True) is None
    value = process_env.bind_cpu_threads(args, has_cuda=False)
    assert value is not None and value.count("|") == 1 and os.environ["SGLANG_CPU_OMP_THREADS_BIND"] == value
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|0")              # the user's value wins
    assert process_env.bind_cpu_threads(args, has_cuda=False) is None
    assert os.environ["SGLANG_CPU_OMP_THREADS_BIND"] == "0|0"
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND")
    one = SimpleNamespace(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, nnodes=1)
    assert process_env.bind_cpu_threads(one, has_cuda=False) is None
    per_node = SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, enable_dp_attention=False, nnodes=2)
    value = process_env.bind_cpu_threads(per_node, has_cuda=False)       # one rank here, two in the run
    assert value is not None and "|" not in value


def test_gloo_interface_follows_dist_init_addr_not_host(monkeypatch):
    assert process_env.gloo_interface("127.0.0.1:5000") == "lo"
    assert process_env.gloo_interface("localhost:5000") == "lo"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE", raising=False)
    process_env.apply("0.0.0.0", has_cuda=False, nnodes=2, dist_init_addr="127.0.0.1:5000")
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo"          # loopback rendezvous, whatever --host is
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    process_env.apply("127.0.0.1", has_cuda=False, nnodes=2, dist_init_addr="10.255.255.1:5000")
    assert os.environ.get("GLOO_SOCKET_IFNAME") != "lo"      # a remote rendezvous never binds gloo to lo


def test_impossible_parallel_layouts_are_named():
    ok = SimpleNamespace(tp_size=2, dp_size=2, enable_dp_attention=True, nnodes=1, pp_size=1)
    assert compat.parallel_refusals(ok) == []
    bad = SimpleNamespace(tp_size=1, dp_size=2, enable_dp_attention=True, nnodes=1, pp_size=1)
    (reason,) = compat.parallel_refusals(bad)
    assert "--enable-dp-attention" in reason and "--tp must be a multiple of --dp" in reason
    nodes = SimpleNamespace(tp_size=3, dp_size=1, enable_dp_attention=False, nnodes=2, pp_size=1)
    assert "--nnodes 2" in compat.parallel_refusals(nodes)[0]


def _fb(locs, n_q):
    return SimpleNamespace(out_cache_loc=torch.tensor(locs), req_pool_indices=torch.zeros(len(n_q), dtype=torch.int64))


def test_padding_rows_are_those_writing_location_zero_at_the_tail():
    r = padding.compute(_fb([5, 9, 0, 0], [1, 1, 1, 1]), [1, 1, 1, 1])     # DP-padded decode
    assert (r.n_req, r.n_tok, r.padded) == (2, 2, True)
    r = padding.compute(_fb([5, 6, 7, 9, 0, 0], [3, 1]), [3, 1])            # extend, padding tokens only
    assert (r.n_req, r.n_tok, r.total_tok, r.padded) == (2, 4, 6, True)
    r = padding.compute(_fb([0, 0, 0], [3]), [3])                          # an idle rank's fabricated extend
    assert (r.n_req, r.n_tok) == (0, 0)
    r = padding.compute(_fb([4, 8], [1, 1]), [1, 1])
    assert not r.padded
    with pytest.raises(RuntimeError, match="not at its tail"):
        padding.compute(_fb([0, 8], [1, 1]), [1, 1])


def test_sglangs_count_of_real_tokens_finds_the_same_rows_without_a_device_read():
    """On a device batch the padding rows come from SGLang's host count (no read of out_cache_loc);
    the same cases as above agree with the location rule, and a CPU batch checks both."""
    cases = [([5, 9, 0, 0], [1, 1, 1, 1], 2), ([5, 6, 7, 9, 0, 0], [3, 1], 4), ([0, 0, 0], [3], 0), ([4, 8], [1, 1], 2)]
    for locs, n_q, count in cases:
        fb = _fb(locs, n_q)
        assert padding.from_count(fb, n_q) is None                          # SGLang did not say
        fb.global_num_token_non_padded_cpu = count
        assert padding.from_count(fb, n_q) == padding.compute(fb, n_q), (locs, n_q, count)
    fb = _fb([5, 9, 0, 0], [1, 1, 1, 1])
    fb.global_num_token_non_padded_cpu, fb.forward_mode = 3, SimpleNamespace(name="DECODE")
    with pytest.raises(RuntimeError, match="no longer matches SGLang's"):
        padding._CACHE.clear()
        padding.real_rows(_with_layout(fb, [1, 1, 1, 1]))


def _with_layout(fb, n_q):
    """A batch query_layout can read (decode: one query token per request)."""
    fb.seq_lens_cpu = torch.full((len(n_q),), 10)
    fb.forward_mode = SimpleNamespace(name="DECODE", is_decode_or_idle=lambda: True)
    return fb


def test_attn_dp_size_is_dp_attention():
    # SGLang 0.5.23's newer spelling: --attn-dp-size N is --dp N --enable-dp-attention (which it
    # deprecates); read as plain TP it would size one shared pool for two DP attention ranks that
    # each build their own (half the host memory checked), and the SLO control would refuse it
    from sgl_ess.integration.sglang.launcher.argv_view import parallel_layout, pools_per_node

    new = parallel_layout(["--tp", "2", "--attn-dp-size", "2"])
    old = parallel_layout(["--tp", "2", "--dp", "2", "--enable-dp-attention"])
    assert new == old and new["dp_attention"] and new["dp"] == 2
    assert pools_per_node(new, has_cuda=False) == 2 and pools_per_node(parallel_layout(["--tp", "2"]), False) == 1
    assert parallel_layout(["--tp=4", "--attn-dp-size=2"])["ranks_per_node"] == 4
    assert parallel_layout(["--tp", "2", "--attention-data-parallel-size", "2"]) == new     # SGLang's long alias
    args = SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, enable_dp_attention=False, nnodes=1, attn_dp_size=2)
    assert compat.parallel_refusals(args) == [] and compat.layout_of(args)[0].attention_tp == 1
    assert process_env.ranks_on_this_node(*(lambda lay: (lay.tp, lay.dp, lay.pp, lay.dp_attention, lay.nnodes))(
        compat.layout_of(args)[0])) == 2
    both = SimpleNamespace(tp_size=2, dp_size=2, pp_size=1, enable_dp_attention=False, nnodes=1, attn_dp_size=2)
    (reason,) = compat.parallel_refusals(both)
    assert "--dp 2 with --attn-dp-size 2" in reason and "--attn-dp-size alone" in reason
    uneven = SimpleNamespace(tp_size=3, dp_size=1, pp_size=1, enable_dp_attention=False, nnodes=1, attn_dp_size=2)
    assert "--tp must be a multiple of --dp / --attn-dp-size" in compat.parallel_refusals(uneven)[0]


def test_the_slo_control_takes_attn_dp_size_as_dp_attention():
    from sgl_ess.config import EssConfig

    cfg = EssConfig(slo_tpot_ms=50.0)
    dpa = SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, nnodes=1, enable_dp_attention=False, attn_dp_size=2,
                          speculative_algorithm=None, enable_two_batch_overlap=False)
    assert not [r for r in compat.refusals(dpa, cfg, has_cuda=False) if "--ess-slo-tpot-ms" in r]
    tp = SimpleNamespace(**{**vars(dpa), "attn_dp_size": 1})
    assert any("attention TP 2" in r for r in compat.refusals(tp, cfg, has_cuda=False))
