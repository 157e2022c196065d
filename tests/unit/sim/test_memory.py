import math

import pytest

from sgl_ess.sim.config import DeploymentConfig, OffloadConfig, ModelSpec, SimConfigError, WorkloadConfig
from sgl_ess.sim.constants import overridden
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.memory import (attention_params_per_layer, check_fits, gpu_bytes_per_request,
                                host_bytes_per_request, memory_report, weight_bytes_per_gpu)

M = ModelSpec.deepseek_v32_exp()


def test_attention_params_hand_sum():
    hand = (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
            + 1536 * 64 * 128 + 7168 * 128 + 7168 * 64)
    assert attention_params_per_layer(M) == hand == 201_064_448


def test_bytes_per_token_all_layers_matches_design_table():
    # ESS.md section 2: latent 40,016 B + indexer 8,052 B per token over 61 layers
    assert M.latent_bytes_per_token_layer * M.num_layers == 40_016
    assert M.indexer_bytes_per_token_layer * M.num_layers == 8_052


def test_gpu_and_host_bytes_per_request_hand_cases():
    w = WorkloadConfig(context_tokens=32768)
    # r = 1: (656 + 132) B x 62 cached layers (61 + MTP) x 32768 tokens
    assert gpu_bytes_per_request(M, w, OffloadConfig(ratio=1.0)) == 788 * 62 * 32768
    assert host_bytes_per_request(M, w, OffloadConfig(ratio=1.0)) == 0
    # r = 0.21: ceil(0.21 x 32768) = 6882 hot slots per layer + full indexer keys
    assert gpu_bytes_per_request(M, w, OffloadConfig(ratio=0.21)) == (132 * 32768 + 6882 * 656) * 62
    assert host_bytes_per_request(M, w, OffloadConfig(ratio=0.21)) == 656 * 62 * 32768


def test_weights_per_gpu_hand_sum():
    wb = weight_bytes_per_gpu(M, DeploymentConfig(ep=32))
    expert = 3 * 7168 * 2048
    assert wb.routed_bytes == 59 * 8 * expert          # 58 MoE layers + MTP, 256/32 local experts, fp8
    replicated = (62 * 201_064_448 + 3 * 3 * 7168 * 18432 + 59 * expert + 59 * 7168 * 256 * 2
                  + 2 * 7168 * 7168 + 2 * 129280 * 7168 * 2)
    assert wb.replicated_bytes == replicated
    assert 39e9 < wb.total_bytes < 42e9


def test_max_batch_hand_case():
    d = DeploymentConfig(gpu_mem_gb=100.0)
    w, e = WorkloadConfig(context_tokens=32768), OffloadConfig(ratio=1.0)
    with overridden(non_cache_reserve_GB=5.0):
        rep = memory_report(M, get_hardware("h200"), d, w, e)
    budget = 100e9 - weight_bytes_per_gpu(M, d).total_bytes - 5e9
    assert rep.max_batch == math.floor(budget / (788 * 62 * 32768))


def test_reserve_interval_implied_by_the_paper_makes_52_the_largest_batch_at_r1():
    # validate reports the interval the paper's "batch 52 fits at r = 1.0, 32K" implies (not used as the reserve):
    # any value in it gives exactly 52
    from sgl_ess.sim.fit import fit_reserve
    hw, d, w = get_hardware("h200"), DeploymentConfig(), WorkloadConfig(batch=52)
    r = fit_reserve()
    assert r.lo_gb < r.value_gb <= r.hi_gb
    for reserve in (r.lo_gb + 1e-3, r.value_gb, r.hi_gb):
        with overridden(non_cache_reserve_GB=reserve):
            assert memory_report(M, hw, d, w, OffloadConfig(ratio=1.0)).max_batch == 52
    with overridden(non_cache_reserve_GB=r.hi_gb + 0.01):
        assert memory_report(M, hw, d, w, OffloadConfig(ratio=1.0)).max_batch == 51


def test_host_memory_limits_batch():
    w, e = WorkloadConfig(context_tokens=32768), OffloadConfig(ratio=0.21)
    per_node = 656 * 62 * 32768 * 8
    rep = memory_report(M, get_hardware("h200"), DeploymentConfig(host_mem_gb=per_node * 100 / 1e9), w, e)
    assert rep.max_batch == rep.max_batch_host == 100 < rep.max_batch_gpu


def test_batch_that_does_not_fit_names_max_and_flag():
    w, e = WorkloadConfig(batch=60), OffloadConfig(ratio=1.0)
    rep = memory_report(M, get_hardware("h200"), DeploymentConfig(), w, e)
    with pytest.raises(SimConfigError, match=rf"largest batch that fits is {rep.max_batch}.*--batch"):
        check_fits(rep, w, e, "h200")


def test_weights_that_do_not_fit_say_so():
    d = DeploymentConfig(gpu_mem_gb=30.0)
    w, e = WorkloadConfig(), OffloadConfig()
    rep = memory_report(M, get_hardware("h200"), d, w, e)
    with pytest.raises(SimConfigError, match="no cache fits"):
        check_fits(rep, w, e, "h200")


@pytest.mark.parametrize("kwargs, match", [
    ({"ratio": 0.0}, "ratio"), ({"ratio": 1.2}, "ratio"), ({"ratio": -0.5}, r"\(0, 1\]"),
    ({"overlap": "half"}, "--overlap"), ({"pcie_h2d_gbps": -1.0}, "--pcie-h2d-gbps"),
    ({"hit_rate": 1.5}, "--hit-rate"),
])
def test_bad_ess_config(kwargs, match):
    with pytest.raises(SimConfigError, match=match):
        OffloadConfig(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    ({"batch": -1}, "--batch"), ({"context_tokens": 0}, "--context"), ({"accept": 2.5, "mtp": 2}, "--accept"),
])
def test_bad_workload(kwargs, match):
    with pytest.raises(SimConfigError, match=match):
        WorkloadConfig(**kwargs)


def test_bad_deployment_and_unknown_hardware():
    with pytest.raises(SimConfigError, match="--gpu-mem-gb"):
        DeploymentConfig(gpu_mem_gb=-80)
    with pytest.raises(SimConfigError, match="h200"):
        get_hardware("b300")
