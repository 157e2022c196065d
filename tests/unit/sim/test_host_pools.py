"""Issue 17: host pools per node for a serving layout (shared vs per rank), by hand for DeepSeek-V3.2,
and at the small scale equal to what the launcher expects and what the store allocates."""
import json

import pytest

from sgl_ess.core.parallel_layout import ParallelLayout, host_pool_bytes
from sgl_ess.sim.cli import main
from sgl_ess.sim.config import DeploymentConfig, ModelSpec, ServingLayoutConfig, SimConfigError, load_data
from sgl_ess.sim.host_pools import PAGE_TOKENS, host_pool_report, latent_row_bytes, node_pools, resolve_layout

ONE_NODE = DeploymentConfig(nodes=1, gpus_per_node=8, ep=8)
TOKENS = 1 << 20


def _report(deploy=ONE_NODE, tokens=TOKENS, **serving):
    return host_pool_report(ServingLayoutConfig(**serving), deploy, tokens, "test")


def test_deepseek_v32_geometry():
    m = ModelSpec.load("deepseek_v32_exp")
    assert m.num_layers == 61
    assert latent_row_bytes(m, "fp8_e4m3") == 656 == 512 + 4 * (512 // 128) + 2 * 64
    assert latent_row_bytes(m, "bf16") == 1152 == load_data("model_deepseek_v32_exp.json")[
        "latent_bytes_per_token_layer_bf16"]


def test_tp8_one_node_shares_one_pool_per_rank_keeps_eight():
    rep = _report(tp=8)
    shared, per_rank = rep.for_sharing("shared"), rep.for_sharing("per-rank")
    assert rep.layout == ParallelLayout(tp=8, dp=1, nnodes=1, dp_attention=False) and rep.chosen == "per-rank"
    assert (shared.ranks_per_node, shared.pools_per_node, per_rank.pools_per_node) == (8, 1, 8)
    assert shared.bytes_per_pool == per_rank.bytes_per_pool == (TOKENS + 64) * 61 * 656
    assert per_rank.host_bytes_per_node == 8 * shared.host_bytes_per_node
    assert _report(tp=8, share_host_pool="per-rank").chosen == "per-rank"


def test_dp8_attention_keeps_eight_pools_either_way():
    rep = _report(tp=8, dp=8, enable_dp_attention=True)
    assert rep.layout.attention_tp == 1
    assert [p.pools_per_node for p in rep.by_sharing] == [8, 8]
    assert rep.for_sharing("shared").host_bytes_per_node == 8 * (TOKENS + 64) * 61 * 656


def test_tp4_over_two_nodes_is_one_pool_per_node():
    rep = _report(DeploymentConfig(nodes=2, gpus_per_node=4, ep=8), tp=4, nnodes=2, kv_cache_dtype="bf16")
    assert rep.row_bytes == 1152
    assert [(p.ranks_per_node, p.pools_per_node) for p in rep.by_sharing] == [(2, 1), (2, 2)]


def test_fit_in_host_memory_per_node():
    per_pool = (TOKENS + 64) * 61 * 656                      # 42.0 GB
    deploy = DeploymentConfig(nodes=1, gpus_per_node=8, ep=8, host_mem_gb=per_pool * 4 / 1e9)
    rep = _report(deploy, tp=8)
    assert (rep.for_sharing("shared").fits, rep.for_sharing("per-rank").fits) == (True, False)
    assert _report(tp=8).for_sharing("shared").fits is None     # no --host-mem-gb: not checked


def test_layout_defaults_follow_the_deployment():
    d = DeploymentConfig()                                    # 4 nodes x 8 GPUs, DP attention
    assert resolve_layout(ServingLayoutConfig(), d) == ParallelLayout(tp=32, dp=32, nnodes=4, dp_attention=True)
    assert resolve_layout(ServingLayoutConfig(enable_dp_attention=True), ONE_NODE) == ParallelLayout(
        tp=8, dp=8, dp_attention=True)
    assert resolve_layout(ServingLayoutConfig(tp=8), ONE_NODE) == ParallelLayout(tp=8)
    assert resolve_layout(ServingLayoutConfig(tp=8, attn_dp_size=8), ONE_NODE) == ParallelLayout(
        tp=8, dp=8, dp_attention=True)                       # SGLang 0.5.23's spelling of the same layout


@pytest.mark.parametrize("serving,match", [
    (dict(tp=8, dp=3, enable_dp_attention=True), "--tp must be a multiple of --dp"),
    (dict(tp=3, nnodes=2), "--nnodes 2"),
    (dict(tp=16), "--gpus-per-node 8"),
    (dict(share_host_pool="sometimes"), "--share-host-pool"),
    (dict(tp=0), "--tp"),
    (dict(tp=8, dp=2, attn_dp_size=2), "--attn-dp-size alone")])
def test_impossible_layouts_name_the_flag(serving, match):
    with pytest.raises(SimConfigError, match=match):
        _report(**serving)


def test_plan_cli_reports_host_pools(capsys):
    assert main(["plan", "--gpus", "8", "--tp", "8", "--ratios", "0.21", "--max-total-tokens", "65536",
                 "--json"]) == 0
    pools = json.loads(capsys.readouterr().out)["host_pools"]
    assert pools["layout"]["tp"] == 8 and pools["tokens_per_pool"] == 65536
    assert pools["by_sharing"]["shared"]["pools_per_node"] == 1
    assert pools["by_sharing"]["per-rank"]["host_bytes_per_node"] == 8 * (65536 + 64) * 61 * 656


@pytest.mark.parametrize("argv", [[], ["--tp", "2"], ["--tp", "8"], ["--tp", "8", "--dp", "8", "--enable-dp-attention"],
                                  ["--tp", "4", "--dp", "2", "--enable-dp-attention"], ["--tp", "4", "--nnodes", "2"]])
def test_sim_counts_pools_as_the_launcher_does(argv):
    from sgl_ess.integration.sglang.launcher.argv_view import parallel_layout, pools_per_node

    lay = parallel_layout(argv)
    sim = ParallelLayout(tp=lay["tp"], dp=lay["dp"], nnodes=lay["nnodes"], dp_attention=lay["dp_attention"])
    assert node_pools(sim, "shared", 1, 1, 1).pools_per_node == pools_per_node(lay, has_cuda=False)
    assert node_pools(sim, "per-rank", 1, 1, 1).pools_per_node == pools_per_node(lay, has_cuda=True)


def test_small_scale_matches_the_launcher_and_the_store():
    from sgl_ess.config import EssConfig
    from sgl_ess.integration.sglang.launcher.launcher_defaults import fill_defaults
    from sgl_ess.models import TINY_DSV32_DIR
    from sgl_ess.serving.preflight import DSA_PAGE_SIZE
    from sgl_ess.store import HostLatentPool

    tokens = 8192
    m = ModelSpec.load("tiny_dsv32")
    row = latent_row_bytes(m, "bf16")
    assert (m.num_layers, row, PAGE_TOKENS) == (2, (64 + 16) * 2, DSA_PAGE_SIZE)
    sim = node_pools(ParallelLayout(tp=2), "shared", tokens, m.num_layers, row)
    _, sizing = fill_defaults(["--model-path", TINY_DSV32_DIR, "--max-total-tokens", str(tokens), "--tp", "2"],
                              EssConfig(), has_cuda=False)
    pool = HostLatentPool(m.num_layers, tokens + PAGE_TOKENS, row)
    assert sim.bytes_per_pool == sizing["host_bytes_expected"] == pool.segment.nbytes
    assert (sim.pools_per_node, sim.host_bytes_per_node) == (sizing["pools_per_node"], sizing["host_bytes_per_node"])
    # the TP 2 CPU server measured 20992000 host bytes for the default 65536 tokens, 1 pool on its node
    assert node_pools(ParallelLayout(tp=2), "shared", 65536, 2, row).host_bytes_per_node == 20992000
    assert host_pool_bytes(65536, PAGE_TOKENS, 2, row) == 20992000


def test_the_share_flag_sets_the_pools_a_cuda_node_sizes_and_needs_the_stream_engine():
    """--ess-share-host-pool on a CUDA node: auto keeps a pool per rank (2 for TP 2), on shares one
    (the stream order), off keeps one per rank on CPU too; `on` with an engine that cannot order the
    ranks' streams is refused before the model loads, naming both flags."""
    from sgl_ess.config import EssConfig
    from sgl_ess.integration.sglang.launcher.launcher_defaults import fill_defaults
    from sgl_ess.models import TINY_DSV32_DIR
    from sgl_ess.serving.preflight import PreflightError

    argv = ["--model-path", TINY_DSV32_DIR, "--max-total-tokens", "8192", "--tp", "2"]
    pools = {(mode, cuda): fill_defaults(list(argv), EssConfig(share_host_pool=mode), has_cuda=cuda)[1]["pools_per_node"]
             for mode in ("auto", "on", "off") for cuda in (False, True)}
    assert pools == {("auto", False): 1, ("auto", True): 2, ("on", False): 1, ("on", True): 1,
                     ("off", False): 2, ("off", True): 2}
    with pytest.raises(PreflightError, match="--ess-share-host-pool on with --ess-prefetch-engine inline"):
        fill_defaults(list(argv), EssConfig(share_host_pool="on", prefetch_engine="inline"), has_cuda=True)
