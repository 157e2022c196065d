"""Issue 33, item 3: the host pool is sized per NODE from the parallel layout, a computed default is
named as a default, and the node's GPUs bound the ranks and the hot buffers
(sgl_ess/integration/sglang/launcher/pool_plan.py; the model's geometry is given, not read)."""
import pytest

from sgl_ess.config import build_config
from sgl_ess.integration.sglang.launcher import launcher_defaults as ld
from sgl_ess.integration.sglang.launcher import argv_view as av
from sgl_ess.integration.sglang.launcher.node_devices import GIB, NodeDevices, parse_spec
from sgl_ess.serving import host_memory
from sgl_ess.serving.preflight import ModelGeometry, PreflightError
from sgl_ess.store.config import StoreConfig

GB = 10 ** 9
DSV32 = ModelGeometry(layers=61, latent_row_bytes=1152, index_topk=2048, vocab_size=129280, kv_lora_rank=512,
                      qk_rope_head_dim=64)
H200_NODE = NodeDevices("cuda", 8, 141 * GIB, "test")
MEM = {"MemTotal": 2048 * GB, "MemAvailable": 1800 * GB}          # usable: 1800 - 204.8 GB kept free


def _plan(argv, devices=H200_NODE, **flags):
    cfg = build_config(None, {k: str(v) for k, v in flags.items()}, environ={})
    return ld.fill_defaults(["--model-path", "deepseek-ai/DeepSeek-V3.2", *argv], cfg, devices.has_cuda, devices,
                            geometry=lambda model, trust, revision: DSV32)


@pytest.fixture(autouse=True)
def _meminfo(monkeypatch):
    monkeypatch.setattr(host_memory, "meminfo", lambda path="/proc/meminfo": dict(MEM))


def test_tp8_default_shares_the_nodes_usable_memory_among_its_eight_pools():
    out, s = _plan(["--tp-size", "8"])
    usable = host_memory.usable_bytes(MEM)
    assert s["pools_per_node"] == 8 and s["host_bytes_per_node"] <= usable
    assert s["host_bytes_per_node"] > 0.99 * usable                  # the budget is used, not 1/8 of it
    row = 512 + 4 * 4 + 2 * 64                                       # FlashMLA's FP8 row: 656 B
    assert s["host_bytes_expected"] == (s["tokens"] + 64) * 61 * row
    assert s["source"].startswith("default ") and "usable host memory" in s["source"] and \
        "/ 8 host pool(s) per node" in s["source"] and "set --ess-memory-pool-size-gb to change" in s["source"]
    assert av.flag_value(out, "--max-total-tokens") == str(s["tokens"])


def test_an_explicit_budget_is_the_nodes_and_is_split_over_its_pools(caplog):
    with caplog.at_level("WARNING", logger="sgl_ess"):
        _, one = _plan(["--tp-size", "8"], memory_pool_size_gb=400, share_host_pool="on")
    assert "pool_budget_split" not in one and "GB per NODE" not in caplog.text      # one pool: nothing to split
    with caplog.at_level("WARNING", logger="sgl_ess"):
        _, eight = _plan(["--tp-size", "8"], memory_pool_size_gb=400)
    assert "GB per NODE, split over its 8 host pools: 50.00 GB each" in eight["pool_budget_split"]
    assert eight["pool_budget_split"] in caplog.text                               # warned, naming the split
    assert one["pools_per_node"] == 1 and eight["pools_per_node"] == 8
    assert one["host_bytes_per_node"] <= 400 * GB and eight["host_bytes_per_node"] <= 400 * GB
    assert eight["tokens"] < one["tokens"] // 7
    assert eight["source"] == "--ess-memory-pool-size-gb 400 per node / 8 host pools on the node"
    with pytest.raises(PreflightError, match=r"--ess-memory-pool-size-gb 5000 per node.*lower "
                                             r"--ess-memory-pool-size-gb"):
        _plan(["--tp-size", "8"], memory_pool_size_gb=5000)


def test_the_cpu_default_is_named_as_a_default():
    _, s = _plan([], devices=NodeDevices("cpu"))
    assert s["tokens"] == 65536 and s["source"].startswith("default 65536 tokens per pool")


def test_the_nodes_gpus_bound_the_ranks_and_the_hot_buffers():
    with pytest.raises(PreflightError, match=r"8 ranks per node .* the node has 4 GPU"):
        _plan(["--tp-size", "8"], devices=NodeDevices("cuda", 4, 141 * GIB, "test"))
    _plan(["--tp-size", "8", "--nnodes", "2"], devices=NodeDevices("cuda", 4, 141 * GIB, "test"))
    _, s = _plan(["--tp-size", "8", "--context-length", "32768"])
    # the whole store the scheduler builds (the same StoreConfig), not only its hot buffers
    store = StoreConfig(num_layers=61, row_bytes=656, host_capacity_tokens=1, hot_slots_per_request=4 * 2048,
                        max_requests=65, topk=2048, max_context_tokens=32768, device="cuda",
                        ring_slots=build_config(None, {}, environ={}).ring_slots)
    assert s["device_allocation"] == store.device_allocation() and s["context_tokens"] == 32768
    assert s["device_bytes_per_device"] == sum(store.device_allocation().values())
    assert s["device_bytes_per_device"] > 61 * 65 * 8192 * 656     # more than 4 x index_topk slots x 65 rows alone
    assert s["device_allocation"]["token_map"] == 66 * 32769 * 4    # request rows + 1, context + 1, int32
    # MTP (issue 35): the scratch rows of a verify's own rows, 4 per request row with 4 draft tokens
    _, mtp = _plan(["--tp-size", "8", "--context-length", "32768", "--speculative-algorithm", "EAGLE",
                    "--speculative-num-draft-tokens", "4"])
    mtp_store = StoreConfig(num_layers=61, row_bytes=656, host_capacity_tokens=1, hot_slots_per_request=4 * 2048,
                            max_requests=65, topk=2048, max_context_tokens=32768, device="cuda",
                            ring_slots=build_config(None, {}, environ={}).ring_slots, verify_rows_per_request=4)
    assert mtp["device_allocation"] == mtp_store.device_allocation()
    assert mtp["device_allocation"]["slot_rows"] > s["device_allocation"]["slot_rows"]
    _, dp = _plan(["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"])
    assert dp["request_rows"] == 64 // 8 + 1                          # per DP-attention worker, as the scheduler
    with pytest.raises(PreflightError, match=r"ESS store .* needs .* GiB on each GPU, but a GPU has 16\.0 GiB"):
        _plan(["--tp-size", "8"], devices=NodeDevices("cuda", 8, 16 * GIB, "test"))


def test_device_specs():
    assert parse_spec("auto") is None and parse_spec("cpu").kind == "cpu"
    assert parse_spec("cuda:8:141") == NodeDevices("cuda", 8, 141 * GIB, "--ess-explain-device cuda:8:141")
    assert parse_spec("cuda:8:141:2048").host_memory_bytes == 2048 * GIB
    for bad in ("cuda", "cuda:0:80", "gpu:8:80", "cuda:8:-1", "cuda:8:141:0", "cuda:8:141:"):
        with pytest.raises(PreflightError, match=r"expected auto, cpu or cuda:N:GiB\[:HostGiB\]"):
            parse_spec(bad)


def test_the_hot_slot_source_is_the_rules_own():
    """The plan carries where the hot slots came from in core/hot_slots.py's words (explain prints it)."""
    from sgl_ess.core.hot_slots import hot_slots_rule

    _, s = _plan(["--tp-size", "8"])
    assert s["hot_slots_source"] == hot_slots_rule(0, 0, 61, 656, 2048, 65)[1] == "4 x index_topk"
    _, s = _plan(["--tp-size", "8"], hot_slots_per_request=4096)
    assert s["hot_slots_per_request"] == 4096 and s["hot_slots_source"] == "--ess-hot-slots-per-request 4096"
    _, s = _plan(["--tp-size", "8"], max_gpu_buffer_size_gb=20)
    assert s["hot_slots_source"].startswith("--ess-max-gpu-buffer-size-gb 20 / (65 request rows x 61 layers")


def test_a_given_host_memory_sizes_the_default_pool_not_this_machines():
    """cuda:N:GiB:HostGiB plans the host pool from the given node's memory; without HostGiB, from this
    machine's /proc/meminfo (the fixture's 2048 GB), and the sizing says which."""
    node = parse_spec("cuda:8:141:1024")
    _, given = _plan(["--tp-size", "8"], devices=node)
    _, here = _plan(["--tp-size", "8"], devices=parse_spec("cuda:8:141"))
    usable = host_memory.usable_bytes({"MemTotal": 1024 * GIB, "MemAvailable": 1024 * GIB})
    assert given["host_memory"]["usable_bytes"] == usable and 0.99 * usable < given["host_bytes_per_node"] <= usable
    assert "1024 GiB given by --ess-explain-device cuda:8:141:1024" in given["host_memory"]["source"]
    assert here["host_memory"]["usable_bytes"] == host_memory.usable_bytes(MEM)
    assert here["host_memory"]["source"] == "this machine's /proc/meminfo"
    with pytest.raises(PreflightError, match="lower --ess-memory-pool-size-gb"):
        _plan(["--tp-size", "8"], devices=parse_spec("cuda:8:141:64"), memory_pool_size_gb=100)


@pytest.mark.parametrize("sm, row", [(9, 1152), (10, 656)])
def test_kv_cache_dtype_auto_is_planned_as_sglang_picks_it(monkeypatch, sm, row):
    """--kv-cache-dtype auto on CUDA: the row SGLang 0.5.23 will use for a DSA model (its own override,
    _dsa_kv_cache_dtype_default, run here with the GPU's SM given) is the row the plan sizes with."""
    import types

    import torch
    from sglang.srt.arg_groups import overrides

    from sgl_ess.integration.sglang.launcher import pool_plan

    hf = types.SimpleNamespace(architectures=["DeepseekV32ForCausalLM"], index_topk=2048)
    monkeypatch.setattr(overrides, "model_config_of", lambda view: types.SimpleNamespace(hf_config=hf))
    monkeypatch.setattr(overrides, "get_platform", lambda: types.SimpleNamespace(is_npu=False, is_xpu=False))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (sm, 0))
    view = types.SimpleNamespace(kv_cache_dtype="auto", dsa_prefill_backend=None, dsa_decode_backend=None)
    sglang_picks = overrides._dsa_kv_cache_dtype_default(view)["kv_cache_dtype"]
    node = NodeDevices("cuda", 8, 141 * GIB, "test", sm_major=sm)
    assert pool_plan.kv_cache_dtype(["--kv-cache-dtype", "auto"], node)[0] == sglang_picks
    _, s = _plan(["--tp-size", "8", "--kv-cache-dtype", "auto"], devices=node)
    assert s["model"]["latent_row_bytes"] == row and s["model"]["kv_cache_dtype"] == sglang_picks


def test_kv_cache_dtype_on_cuda_defaults_to_the_launchers_fp8_and_unknown_sm_plans_bf16():
    _, s = _plan(["--tp-size", "8"])                                  # ESS on CUDA: launcher sets fp8_e4m3
    assert s["model"]["kv_cache_dtype"] == "fp8_e4m3" and s["model"]["latent_row_bytes"] == 656
    _, s = _plan(["--tp-size", "8", "--kv-cache-dtype", "auto"])      # a spec node: SM not known
    assert s["model"]["latent_row_bytes"] == 1152 and "SM is not known" in s["model"]["kv_cache_dtype_source"]
