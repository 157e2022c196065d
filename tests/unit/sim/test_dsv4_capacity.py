"""The DeepSeek-V4 capacity model (sgl_ess/sim/dsv4.py): its byte sizes are SGLang 0.5.23's own (the pool
classes built on CPU, the functions they size with), its parts add up, and the CLI answers or refuses."""
import json

import pytest

from sgl_ess.sim.cli import main
from sgl_ess.sim.dsv4 import V4Spec, capacity, host_bytes_per_token, request_parts

torch = pytest.importorskip("torch")
pool = pytest.importorskip("sglang.srt.mem_cache.deepseek_v4_memory_pool")
state = pytest.importorskip("sglang.srt.mem_cache.deepseek_v4_compress_state")

M = V4Spec.load("v4-flash")


def test_schedule_is_v4_flash():
    assert len(M.ratios) == 43
    assert M.ratios[:4] == (0, 0, 4, 128) and M.ratios[-1] == 4
    assert (M.c4_layers, M.c128_layers) == (21, 20)


def test_entry_and_index_bytes_are_sglangs():
    kv = pool.DeepSeekV4SingleKVPool(size=256, page_size=64, dtype=torch.uint8, qk_nope_head_dim=448,
                                     qk_rope_head_dim=64, layer_num=1, device="cpu", enable_memory_saver=False)
    assert kv.get_bytes_per_token() == M.entry_bytes
    assert kv.kv_buffer[0].shape[1] % 576 == 0 and kv.kv_buffer[0].shape[1] >= 64 * M.entry_bytes
    assert pool.get_dsv4_indexer_bytes_per_token(M.index_head_dim, False) == M.indexer_bytes_per_entry
    assert pool.get_compress_state_ring_size(4) == M.c4_state_ring
    assert pool.get_compress_state_ring_size(128) == M.c128_state_ring


def _state_bytes(ratio: int, head_dim: int, requests: int) -> int:
    ring = pool.get_compress_state_ring_size(ratio)
    s = state.CompressStatePool(size=requests * ring, ring_size=ring, overlap=ratio == 4, head_dim=head_dim,
                                dtype=torch.float32, device="cpu", enable_memory_saver=False, ratio=ratio,
                                online=False, request_scoped=ratio == 128, swa_page_size=M.swa_page_tokens)
    b = s.kv_score_buffer.kv_score
    return b.numel() * b.element_size()


def test_compressor_state_per_request_is_sglangs_allocation():
    """Ten more requests' rings in SGLang's CompressStatePool (attention and indexer state on C4 layers,
    attention state on C128 layers) = ten times the model's per-request state."""
    per10 = (M.c4_layers * (_state_bytes(4, M.head_dim, 20) - _state_bytes(4, M.head_dim, 10)
                            + _state_bytes(4, M.index_head_dim, 20) - _state_bytes(4, M.index_head_dim, 10))
             + M.c128_layers * (_state_bytes(128, M.head_dim, 20) - _state_bytes(128, M.head_dim, 10)))
    assert per10 == 10 * request_parts(M, 32768, False, 0.21)["compressor_state"]


def test_ess_moves_only_the_c4_entries():
    ctx = 131072
    resident, ess = request_parts(M, ctx, False, 0.21), request_parts(M, ctx, True, 0.21)
    assert {k: v for k, v in resident.items() if k != "c4_entries"} == \
           {k: v for k, v in ess.items() if k != "c4_hot_buffer"}
    assert resident["c4_entries"] == host_bytes_per_token(M) * ctx == 21 * (ctx // 4) * 584
    assert ess["c4_hot_buffer"] == 21 * -(-21 * (ctx // 4) // 100) * 584


def test_window_is_per_request_and_hot_buffer_holds_a_topk():
    small, large = request_parts(M, 4096, True, 0.01), request_parts(M, 1 << 20, True, 0.01)
    assert small["window"] == large["window"] == 43 * 512 * 584
    assert small["c4_hot_buffer"] == 21 * 512 * 584          # 1% of 1024 entries < one top-k of 512
    assert request_parts(M, 1024, True, 0.5)["c4_hot_buffer"] == 21 * 256 * 584   # all 256 entries


def test_capacity_batches_and_host_limit():
    c = capacity(M, 131072, 141e9, 8, 0.21)
    budget = c.budget_bytes
    assert c.batch_resident == int(budget // sum(c.resident.values()))
    assert c.batch_ess == int(budget // sum(c.ess.values())) > c.batch_resident
    limited = capacity(M, 131072, 141e9, 8, 0.21, host_mem_gb=1000, gpus_per_node=8)
    assert limited.batch_ess == limited.batch_ess_host == int(1000e9 // (c.host_bytes_per_request * 8))


def test_cli_json_and_refusals(capsys):
    assert main(["v4", "--context", "32k", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["context"] == 32768 and row["batch_ess"] >= row["batch_resident"] > 0
    assert main(["run", "--model", "deepseek-v4"]) == 2
    assert "python -m sgl_ess.sim v4" in capsys.readouterr().err
    assert main(["v4", "--context", "lots"]) == 2
    assert "--context 'lots'" in capsys.readouterr().err
    assert main(["v4", "--gpu-mem-gb", "20"]) == 2
    assert "no cache fits" in capsys.readouterr().err
