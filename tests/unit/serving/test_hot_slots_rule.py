"""Issue 16 ("one derivation per number"): the hot slots per request that the launcher's preflight
checks are the ones the scheduler's store is built with - both call sgl_ess/core/hot_slots.py."""

import pytest

from sgl_ess.config import EssConfig
from sgl_ess.integration.sglang.pools.pool_adapter import derive_hot_slots
from sgl_ess.serving.preflight import ModelGeometry, PreflightError, check_hot_slots


@pytest.mark.parametrize("flags", [{}, {"hot_slots_per_request": 300}, {"max_gpu_buffer_size_gb": 0.05},
                                   {"max_gpu_buffer_size_gb": 2.0}])
def test_preflight_and_store_derive_the_same_hot_slots(flags):
    geo = ModelGeometry(layers=61, latent_row_bytes=656, index_topk=64, vocab_size=None)
    running = 16                                      # SGLang: 17 request rows (row 0 is padding)
    cfg = EssConfig(**flags)
    checked = check_hot_slots(cfg.hot_slots_per_request, cfg.max_gpu_buffer_size_gb, geo, running)
    built = derive_hot_slots(cfg, geo.index_topk, geo.layers, geo.latent_row_bytes, running + 1)
    assert checked == built >= geo.index_topk + 1


def test_too_small_a_budget_is_refused_by_both_naming_the_flag():
    geo = ModelGeometry(layers=61, latent_row_bytes=656, index_topk=2048, vocab_size=None)
    cfg = EssConfig(max_gpu_buffer_size_gb=0.5)
    with pytest.raises(PreflightError, match="--ess-max-gpu-buffer-size-gb 0.5"):
        check_hot_slots(0, 0.5, geo, 16)
    with pytest.raises(ValueError, match="--ess-max-gpu-buffer-size-gb 0.5"):
        derive_hot_slots(cfg, geo.index_topk, geo.layers, geo.latent_row_bytes, 17)
