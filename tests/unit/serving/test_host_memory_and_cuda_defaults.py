"""Host-pool sizing against host memory, and the launcher's defaults for ESS on a GPU (pure
functions: they run before SGLang or torch are imported, so a CPU machine can check them)."""
import os

import pytest

from sgl_ess.config import build_config
from sgl_ess.integration.sglang.launcher import launcher_defaults as ld
from sgl_ess.integration.sglang.launcher import argv_view as av
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import PreflightError, model_geometry

GB = 10 ** 9


def test_meminfo_is_read_in_bytes(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16384000 kB\nMemFree:  1 kB\nMemAvailable:    8192000 kB\n")
    assert host_memory.meminfo(str(f)) == {"MemTotal": 16384000 * 1024, "MemAvailable": 8192000 * 1024}
    assert host_memory.meminfo(str(tmp_path / "missing")) == {}


def test_margin_is_the_larger_of_8_gib_and_ten_percent():
    assert host_memory.safety_margin_bytes(16 * GB) == 8 << 30
    assert host_memory.safety_margin_bytes(1000 * GB) == 100 * GB


def test_a_pool_that_cannot_fit_is_refused_with_the_numbers_and_the_flag():
    info = {"MemTotal": 256 * GB, "MemAvailable": 200 * GB}        # usable: 200 - 25.6 = 174.4 GB
    host_memory.check_host_pool(170 * GB, "--ess-memory-pool-size-gb 170", info)
    with pytest.raises(PreflightError, match=r"needs 180\.00 GB.*200\.00 GB available.*25\.60 GB free.*"
                                             r"--ess-memory-pool-size-gb"):
        host_memory.check_host_pool(180 * GB, "--ess-memory-pool-size-gb 180", info)
    host_memory.check_host_pool(10 ** 15, "x", {})                  # unknown memory: nothing to check


def _cfg(**flags):
    return build_config(None, {k: str(v) for k, v in flags.items()}, environ={})


def test_cpu_defaults_keep_the_torch_backend():
    out, _ = ld.fill_defaults([], _cfg(), has_cuda=False)
    assert av.flag_value(out, "--attention-backend") == "ess" and av.flag_value(out, "--device") == "cpu"
    assert not av.has_flag(out, "--disable-cuda-graph") and not av.has_flag(out, "--cuda-graph-backend-decode")


def test_gpu_defaults_for_ess_on(monkeypatch):
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 64 * GB,
                                                                              "MemAvailable": 40 * GB})
    out, sizing = ld.fill_defaults([], _cfg(), has_cuda=True)
    assert av.flag_value(out, "--attention-backend") == "dsa"        # SGLang's, extended by sgl-ess
    assert av.flag_value(out, "--kv-cache-dtype") == "fp8_e4m3"
    assert av.flag_value(out, "--dsa-decode-backend") == "flashmla_kv"
    assert av.flag_value(out, "--page-size") == "64" and not av.has_flag(out, "--disable-cuda-graph")  # deprecated
    assert av.flag_value(out, "--cuda-graph-backend-decode") == av.flag_value(out, "--cuda-graph-backend-prefill") \
        == "disabled"
    # nothing sized the host pool: available memory minus the margin (40 - 8 GiB), in FP8 rows
    usable = 40 * GB - (8 << 30)
    geo = model_geometry(av.flag_value(out, "--model-path"))
    fp8_row = 64 + 0 + 2 * 16                                          # tiny model: kv_lora 64, rope 16
    expected = (usable // (geo.layers * fp8_row)) // 64 * 64 - 64
    assert int(av.flag_value(out, "--max-total-tokens")) == expected
    assert sizing["host_bytes_expected"] <= usable


def test_gpu_defaults_for_ess_off_are_sglangs():
    out, _ = ld.fill_defaults([], _cfg(enabled="false"), has_cuda=True)
    assert av.flag_value(out, "--attention-backend") == "dsa"
    assert not av.has_flag(out, "--cuda-graph-backend-decode") and not av.has_flag(out, "--kv-cache-dtype")


def test_decode_graphs_with_ess_need_the_ess_flag():
    """A decode graph flag of the user's is refused without --ess-cuda-graph (the eager ESS step is not
    graph-safe: tests/integration/test_cuda_graph_gpu_fake.py); with it decode graphs are SGLang's
    default, prefill graphs stay off; --disable-cuda-graph is kept as given."""
    with pytest.raises(PreflightError, match="needs --ess-cuda-graph true"):
        ld.cuda_ess_defaults(["--cuda-graph-backend-decode", "full"])
    out = ld.cuda_ess_defaults(["--cuda-graph-backend-decode", "full"], graphs=True)
    assert av.flag_value(out, "--cuda-graph-backend-decode") == "full"
    assert av.flag_value(out, "--cuda-graph-backend-prefill") == "disabled"
    out = ld.cuda_ess_defaults([], graphs=True)
    assert not av.has_flag(out, "--cuda-graph-backend-decode")              # SGLang's default: captured
    assert av.flag_value(out, "--cuda-graph-backend-prefill") == "disabled"
    assert not av.has_flag(ld.cuda_ess_defaults(["--disable-cuda-graph"]), "--cuda-graph-backend-decode")
    # SGLang's per-phase flags override --disable-cuda-graph: they are checked with it too
    with pytest.raises(PreflightError, match="needs --ess-cuda-graph true"):
        ld.cuda_ess_defaults(["--disable-cuda-graph", "--cuda-graph-backend-decode", "full"])
    with pytest.raises(PreflightError, match="ESS prefill is not captured"):
        ld.cuda_ess_defaults(["--disable-cuda-graph", "--cuda-graph-backend-prefill", "full"])
    # whole steps only: a breakable or piecewise decode graph runs attention outside the graph
    for backend in ("breakable", "tc_piecewise"):
        with pytest.raises(PreflightError, match="captured whole"):
            ld.cuda_ess_defaults(["--cuda-graph-backend-decode", backend], graphs=True)
    with pytest.raises(PreflightError, match="cannot tell which phases"):
        ld.cuda_ess_defaults(["--cuda-graph-config", '{"decode": {"backend": "full"}}'], graphs=True)
    with pytest.raises(PreflightError, match="ESS prefill is not captured"):
        ld.cuda_ess_defaults(["--cuda-graph-backend-prefill", "full"], graphs=True)


@pytest.mark.parametrize("argv,flags,env,why", [
    (["--speculative-algorithm", "EAGLE"], {}, {"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "0"},
     "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=0"),
    (["--enable-two-batch-overlap", "--speculative-algorithm", "EAGLE"], {},
     {"SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH": "0"}, "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH=0"),
    ([], {"prefetch_engine": "worker"}, {}, "--ess-prefetch-engine worker"),
    ([], {"speculative_prefetch": "next_layer"}, {}, "--ess-speculative-prefetch"),
    ([], {"share_host_pool": "on"}, {}, "--ess-share-host-pool on"),
    ([], {}, {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "1"}, "SGLANG_ENABLE_METADATA_GLUE_GRAPH"),
    ([], {}, {"SGLANG_ENABLE_METADATA_GLUE_GRAPH": "y"}, "SGLANG_ENABLE_METADATA_GLUE_GRAPH"),
    (["--debug-cuda-graph"], {}, {}, "--debug-cuda-graph"),
    (["--enable-torch-compile"], {}, {}, "--enable-torch-compile"),
    (["--dsa-decode-backend", "tilelang"], {}, {}, "only the FlashMLA decode paths"),
    ([], {"trace_file": "/tmp/t.jsonl"}, {}, "--ess-trace-file"),
])
def test_ess_cuda_graph_refuses_what_a_replay_cannot_hold(monkeypatch, argv, flags, env, why):
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 64 * GB,
                                                                              "MemAvailable": 40 * GB})
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(PreflightError, match=why):
        ld.fill_defaults(argv, _cfg(cuda_graph="true", **flags), has_cuda=True)
    for k in env:
        monkeypatch.delenv(k)
    out, _ = ld.fill_defaults([], _cfg(cuda_graph="true"), has_cuda=True)    # alone: accepted
    assert av.flag_value(out, "--cuda-graph-backend-prefill") == "disabled"
    out, _ = ld.fill_defaults([], _cfg(cuda_graph="true"), has_cuda=False)   # no CUDA: ignored
    assert not av.has_flag(out, "--cuda-graph-backend-decode")
    # decode graphs turned off by a flag: --ess-cuda-graph has no effect, nothing is refused for it
    for off in (["--cuda-graph-backend-decode", "disabled"], ["--disable-cuda-graph"]):
        out, _ = ld.fill_defaults([*off, *argv], _cfg(cuda_graph="true", **flags), has_cuda=True)


def test_ess_cuda_graph_serves_split_fetch(monkeypatch):
    """--ess-tp-split-fetch with --ess-cuda-graph (issue 35 item 3): accepted; on the stream engine its exchange
    has a static size and is captured with the step (tests/integration/test_cuda_graph_split_fetch_gpu_fake.py)."""
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 64 * GB,
                                                                              "MemAvailable": 40 * GB})
    out, _ = ld.fill_defaults([], _cfg(cuda_graph="true", tp_split_fetch="true"), has_cuda=True)
    assert ld.decode_graphs_on(out)


def test_ess_cuda_graph_serves_two_batch_overlap_decode_and_verify(monkeypatch):
    """TBO with --ess-cuda-graph (issue 35 item 3): accepted without MTP (its children's decode captured,
    tests/integration/test_cuda_graph_tbo_gpu_fake.py) and with MTP (its children's TARGET_VERIFY captured,
    tests/integration/test_cuda_graph_tbo_verify_gpu_fake.py; the draft extend eager as without TBO)."""
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 64 * GB,
                                                                              "MemAvailable": 40 * GB})
    out, _ = ld.fill_defaults(["--enable-two-batch-overlap"], _cfg(cuda_graph="true"), has_cuda=True)
    assert ld.decode_graphs_on(out) and av.has_flag(out, "--enable-two-batch-overlap")
    env = "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"
    monkeypatch.delenv(env, raising=False)
    mtp = ["--enable-two-batch-overlap", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
           "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    out, _ = ld.fill_defaults(mtp, _cfg(cuda_graph="true"), has_cuda=True)
    assert ld.decode_graphs_on(out) and av.has_flag(out, "--enable-two-batch-overlap")
    assert os.environ[env] == "1"
    # the other refusals still hold with TBO
    with pytest.raises(PreflightError, match="--ess-speculative-prefetch"):
        ld.fill_defaults(["--enable-two-batch-overlap"], _cfg(cuda_graph="true", speculative_prefetch="next_layer"),
                         has_cuda=True)


@pytest.mark.parametrize("algo", ["EAGLE", "NEXTN"])
def test_ess_cuda_graph_serves_mtp_with_the_draft_extend_eager(monkeypatch, algo):
    """MTP with --ess-cuda-graph (issue 35 item 3): accepted, with its TARGET_VERIFY and draft decode steps
    captured (tests/integration/test_cuda_graph_{verify,draft}_gpu_fake.py) and SGLang's draft-extend graph,
    which ESS does not hold, turned off unless the user chose; a choice of 1 is kept, 0 refused (the table
    above). Other refusals still hold with MTP."""
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 64 * GB,
                                                                              "MemAvailable": 40 * GB})
    env = "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH"
    mtp = ["--speculative-algorithm", algo, "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
           "--speculative-num-draft-tokens", "4"]
    monkeypatch.delenv(env, raising=False)
    out, _ = ld.fill_defaults(mtp, _cfg(cuda_graph="true"), has_cuda=True)
    assert os.environ[env] == "1"
    assert ld.decode_graphs_on(out) and av.flag_value(out, "--cuda-graph-backend-prefill") == "disabled"
    monkeypatch.setenv(env, "true")
    ld.fill_defaults(mtp, _cfg(cuda_graph="true"), has_cuda=True)
    assert os.environ[env] == "true"
    ld.fill_defaults([*mtp, "--enable-two-batch-overlap"], _cfg(cuda_graph="true"), has_cuda=True)   # TBO too
    monkeypatch.delenv(env)
    ld.fill_defaults(mtp, _cfg(), has_cuda=True)       # no --ess-cuda-graph: SGLang's env left alone
    assert env not in os.environ


def test_an_explicit_pool_larger_than_host_memory_stops_the_launch(monkeypatch):
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": {"MemTotal": 32 * GB,
                                                                              "MemAvailable": 20 * GB})
    with pytest.raises(PreflightError, match="lower --ess-memory-pool-size-gb"):
        ld.fill_defaults([], _cfg(memory_pool_size_gb=50), has_cuda=False)


def test_dp_ranks_are_balanced_by_host_rows_in_use_with_ess_on():
    dp = ["--tp", "2", "--dp", "2", "--enable-dp-attention"]
    assert av.flag_value(ld.dp_balance_default(dp, True), "--load-balance-method") == "total_tokens"
    assert av.flag_value(ld.dp_balance_default(["--dp-size", "2"], True), "--load-balance-method") == "total_tokens"
    assert ld.dp_balance_default(dp, False) == dp                                     # ESS off: SGLang's own
    assert ld.dp_balance_default(["--tp", "2"], True) == ["--tp", "2"]                # one DP rank: nothing
    chosen = [*dp, "--load-balance-method", "round_robin"]
    assert ld.dp_balance_default(chosen, True) == chosen                              # the user's choice wins
    prefill = [*dp, "--disaggregation-mode", "prefill"]
    assert ld.dp_balance_default(prefill, True) == prefill                            # PD keeps SGLang's rule
