"""store_device.py: the sim's arithmetic of the ESS store's device allocation, by hand and against the store's
own StoreConfig.device_allocation (with layer_anchors: one LRU table per anchor), and the memory model
that counts it."""
import math

import pytest

from sgl_ess.sim.config import DeploymentConfig, ModelSpec, OffloadConfig, WorkloadConfig
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.memory import ess_store_bytes, gpu_cache_bytes, memory_report, weight_bytes_per_gpu
from sgl_ess.sim.store_device import lru_tables, model_store_allocation, store_device_allocation


def test_hand_case():
    # 3 layers, 656 B rows, top-4, 2 request rows, 5 hot slots, 10 tokens, 2 LRU tables, 2 draft tokens
    a = store_device_allocation(layers=3, row_bytes=656, topk=4, request_rows=2, hot_slots=5, context_tokens=10,
                                lru_tables=2, draft_tokens=2)
    # ring: 8 groups x max(4, 2 x 4 // 8) = 32 rows; MTP: 2 x (2 + (2 x 4 - 5)) = 10 rows; hot 3 x 2 x 5 = 30
    assert a == {"slot_rows": 128 * 656, "ring_tags": 8 * 32, "lru_state": 2 * 3 * 5 * 12, "token_map": 3 * 11 * 4,
                 "counters": 8 * (2 * 3 * 2 + 6 * 3), "group_map": 0, "speculative": 0, "engine": 656 + 32,
                 # redirect int32 [4 micro-batches, 2 rows, 5 + 1] + iota int64 [2 rows]
                 "plan_scratch": 4 * 4 * 2 * 6 + 8 * 2}


CASES = [  # layers, row, topk, rows, hot, ctx, anchors, draft
    (3, 656, 4, 2, 5, 10, (), 0),
    (7, 1152, 16, 9, 40, 300, (0, 1, 1, 1, 4, 4, 6), 3),
    (7, 656, 16, 33, 17, 64, (0, 0, 0, 3, 3, 3, 3), 4),
    (61, 656, 2048, 55, 13108, 131072, (), 2),
]


@pytest.mark.parametrize("layers,row,topk,rows,hot,ctx,anchors,draft", CASES)
def test_equals_the_stores_own_device_allocation(layers, row, topk, rows, hot, ctx, anchors, draft):
    from sgl_ess.integration.sglang.pools.device_budget import verify_rows_per_request
    from sgl_ess.store.config import StoreConfig

    sc = StoreConfig(num_layers=layers, row_bytes=row, host_capacity_tokens=1024, hot_slots_per_request=hot,
                     max_requests=rows, topk=topk, max_context_tokens=ctx, layer_anchors=anchors,
                     verify_rows_per_request=verify_rows_per_request(draft, topk, hot))
    sim = store_device_allocation(layers=layers, row_bytes=row, topk=topk, request_rows=rows, hot_slots=hot,
                                  context_tokens=ctx, lru_tables=len(set(anchors)) if anchors else layers,
                                  draft_tokens=draft)
    assert sim == sc.device_allocation()


def test_lru_tables_per_model():
    assert lru_tables(ModelSpec.load("deepseek_v32_exp")) == 61
    assert lru_tables(ModelSpec.load("glm_5_2")) == 21
    assert lru_tables(ModelSpec.load("hyv4")) == 10
    assert lru_tables(ModelSpec.load("longcat_flash_dsa")) == 56


def test_memory_counts_the_whole_store():
    """With ESS: GPU cache bytes = per request (indexer keys + the MTP layer's hot buffer) + the target store;
    the largest batch is the last one whose bytes fit the budget."""
    m, hw, d = ModelSpec.load("deepseek_v32_exp"), get_hardware("h200"), DeploymentConfig()
    w, e = WorkloadConfig(context_tokens=32768, mtp=2), OffloadConfig(ratio=0.21)
    b = 100
    store = sum(model_store_allocation(m, b, 0.21, 32768, 2).values())
    assert ess_store_bytes(m, w, e, b) == store
    assert gpu_cache_bytes(m, w, e, b) == b * (32768 * 132 * 62 + math.ceil(0.21 * 32768) * 656 * 1) + store
    rep = memory_report(m, hw, d, w, e)
    fixed = weight_bytes_per_gpu(m, d).total_bytes + rep.reserve_bytes
    assert rep.gpu_used_bytes(b) == fixed + gpu_cache_bytes(m, w, e, b)
    n = rep.max_batch_gpu
    assert rep.gpu_used_bytes(n) <= hw.memory_bytes < rep.gpu_used_bytes(n + 1)
