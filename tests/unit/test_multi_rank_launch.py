"""Issue 17: what the launcher sets and refuses for multi-rank runs, and how padding rows are found
(no server: the pure parts of process_env, compat and padding)."""

import os
from types import SimpleNamespace

import pytest
import torch

from sgl_ess.integration.sglang import compat, padding, process_env


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
