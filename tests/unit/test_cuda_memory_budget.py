"""The ESS store inside SGLang's GPU budget (issue 16): `StoreConfig.device_allocation` is what a
store allocates on its device (measured: every device storage the store holds), and the pool-budget
hook (cuda_memory.py) takes the target's and the EAGLE draft's stores out of the bytes SGLang sizes its pools from - before this,
the store was allocated after SGLang's pools, outside its budget. The configurator's method is a
stub here (the hook's CUDA branch has never run on a GPU)."""
import gc
import types
from types import SimpleNamespace

import pytest
import torch

from sgl_ess.config import ENV_CONFIG_JSON, EssConfig
from sgl_ess.prefetch.stream_engine import StreamEngine
from sgl_ess.store import LatentStore, StoreConfig
from tests.stream_doubles import LateStreams

_LEAVES = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes,
           int, float)


def _device_bytes(root, device: torch.device) -> dict[int, int]:
    """Every storage on `device` reachable from `root` (its attributes, containers and the objects they hold,
    recursively): storage id -> bytes. Not a list of the tensors the budget counts, so a tensor the budget
    forgets is found."""
    seen, out, stack = set(), {}, [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _LEAVES):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            if o.device == device:
                out[o.untyped_storage()._cdata] = o.untyped_storage().nbytes()
            continue
        stack.extend(gc.get_referents(o))
    return out


@pytest.mark.parametrize("spec_slots, ring_slots, requests, hot_groups, verify_rows",
                         [(0, 0, 5, 0, 0), (48, 0, 9, 0, 0), (0, 70, 3, 0, 0), (48, 0, 30, 7, 0), (0, 0, 9, 0, 16),
                          (48, 0, 30, 7, 4)])
def test_device_allocation_is_what_the_store_allocates(spec_slots, ring_slots, requests, hot_groups, verify_rows):
    """Issue 32: measured, not listed. The store is built on the meta device (every tensor it puts on its
    device has a size and no memory; its host pool stays on the CPU), with the engine CUDA gives it (the
    stream engine, its streams a double), and every meta storage it holds is summed. `verify_rows`: the MTP
    scratch rows per request row (issue 35, store/verify_slots.py) are in it."""
    cfg = StoreConfig(num_layers=3, row_bytes=40, host_capacity_tokens=64, hot_slots_per_request=20,
                      max_requests=requests, topk=8, max_context_tokens=300, spec_slots=spec_slots,
                      ring_slots=ring_slots, hot_groups=hot_groups, device="meta", resolver_backend="torch",
                      verify_rows_per_request=verify_rows)
    store = LatentStore(cfg, transfer_backend="torch", engine="inline",
                        speculative="next_layer" if spec_slots else "off")
    store.engine = StreamEngine(store.memory, "torch", device="meta", runtime=LateStreams(), zero_backend="torch")
    measured = _device_bytes(store, torch.device("meta"))
    assert store.slots.rows.untyped_storage()._cdata in measured and store.host.rows.device.type == "cpu"
    assert sum(measured.values()) == sum(cfg.device_allocation().values()), \
        f"measured {sum(measured.values())} B in {len(measured)} storages, budget {cfg.device_allocation()}"
    assert cfg.device_allocation()["slot_rows"] >= cfg.device_bytes        # whole pages of the latent bytes
    store.shutdown()


def test_device_allocation_covers_what_a_step_allocates_later(monkeypatch):
    """Measured after what a step uses ran (the Triton resolver's epilogue scratch; a padded batch's
    write_slots): what a step adds must be in the budget too (issue 32 item 7: it measured 29,592 B against a
    27,872 B budget while the scratch was allocated on first use). The copy itself is stubbed (meta
    tensors hold no bytes); only what the store keeps is measured."""
    from sgl_ess.store import latent_store

    cfg = StoreConfig(num_layers=3, row_bytes=40, host_capacity_tokens=64, hot_slots_per_request=20,
                      max_requests=5, topk=8, max_context_tokens=300, device="meta", resolver_backend="torch")
    store = LatentStore(cfg, transfer_backend="torch", engine="inline")
    store.engine = StreamEngine(store.memory, "torch", device="meta", runtime=LateStreams(), zero_backend="torch")
    monkeypatch.setattr(latent_store, "copy_rows", lambda *a, **k: None)
    for mb in range(cfg.ring_micro_batches):
        store._redirect_scratch(mb)
    store.write_slots(torch.full((cfg.max_requests,), -1, device="meta"),
                      torch.empty((cfg.max_requests, cfg.row_bytes), dtype=torch.uint8, device="meta"), padded=True)
    measured = _device_bytes(store, torch.device("meta"))
    assert sum(measured.values()) == sum(cfg.device_allocation().values()), \
        f"measured {sum(measured.values())} B in {len(measured)} storages, budget {cfg.device_allocation()}"
    store.shutdown()


def _kvc(layers=4, device="cuda:0"):
    mc = SimpleNamespace(hf_config=SimpleNamespace(index_topk=8, num_nextn_predict_layers=1), context_len=1024,
                         num_hidden_layers=layers)
    return SimpleNamespace(use_mla_backend=True, is_draft_worker=False, device=device, model_config=mc,
                           layer_info=SimpleNamespace(num_effective_layers=layers))


@pytest.fixture
def hook(monkeypatch):
    pytest.importorskip("sglang")
    from sglang.srt import runtime_context

    from sgl_ess.integration.sglang.pools import cuda_memory

    monkeypatch.setenv(ENV_CONFIG_JSON, EssConfig(hot_slots_per_request=20).to_json())
    monkeypatch.setattr(cuda_memory, "latent_bytes_per_token", lambda kvc, n: 656 * n)
    monkeypatch.setattr(runtime_context, "get_schedule", lambda: SimpleNamespace(max_running_requests=7))
    spec = SimpleNamespace(speculative_algorithm=None, speculative_num_draft_tokens=None,
                           max_speculative_num_draft_tokens=None)
    monkeypatch.setattr(runtime_context, "get_spec", lambda: spec)
    return cuda_memory, spec


def _store_bytes(layers: int, rows: int = 8, verify_rows: int = 0) -> int:
    cfg = StoreConfig(num_layers=layers, row_bytes=656, host_capacity_tokens=1, hot_slots_per_request=20,
                      max_requests=rows, topk=8, max_context_tokens=1024,   # 7 running + SGLang's padding row
                      verify_rows_per_request=verify_rows)
    return sum(cfg.device_allocation().values())


def test_pool_budget_leaves_room_for_the_store(hook):
    cuda_memory, spec = hook
    avail = 1 << 30
    got = cuda_memory._around_profile_available_bytes(lambda self, pre: avail, _kvc(), 0)
    assert got == avail - _store_bytes(4)
    spec.speculative_algorithm = "EAGLE"             # the draft runner's store (1 MTP layer) too, and in both
    spec.speculative_num_draft_tokens = 4            # the MTP scratch rows: 4 window rows + the union's overflow
    scratch = 4 + (4 * 8 - 20)                       # past 20 hot slots (4 top-8 sets: up to 32 distinct)
    got = cuda_memory._around_profile_available_bytes(lambda self, pre: avail, _kvc(), 0)
    assert got == avail - _store_bytes(4, verify_rows=scratch) - _store_bytes(1, verify_rows=scratch)
    assert _store_bytes(4, verify_rows=scratch) > _store_bytes(4)


def test_pool_budget_unchanged_off_cuda_and_for_the_draft_worker(hook):
    cuda_memory, _ = hook
    assert cuda_memory._around_profile_available_bytes(lambda self, pre: 12345, _kvc(device="cpu"), 0) == 12345
    draft = _kvc()
    draft.is_draft_worker = True
    assert cuda_memory._around_profile_available_bytes(lambda self, pre: 12345, draft, 0) == 12345


def test_pool_budget_too_small_for_the_store_stops_with_the_fix(hook):
    cuda_memory, _ = hook
    with pytest.raises(ValueError) as e:
        cuda_memory._around_profile_available_bytes(lambda self, pre: _store_bytes(4) - 1, _kvc(), 0)
    for needle in ("--ess-hot-slots-per-request", "--max-running-requests", "--mem-fraction-static"):
        assert needle in str(e.value)


def test_pool_budget_per_dp_attention_worker(hook):
    """Each DP-attention worker serves --max-running-requests / attn_dp_size requests (SGLang's rule):
    7 // 2 = 3 running + the padding row."""
    cuda_memory, _ = hook
    kvc = _kvc()
    kvc.attn_dp_size = 2
    assert cuda_memory._around_profile_available_bytes(lambda self, pre: 1 << 30, kvc, 0) == (1 << 30) - _store_bytes(4, 4)


def test_a_store_larger_than_its_reservation_is_reported(hook, caplog):
    from sgl_ess.integration.sglang.pools import device_budget

    cuda_memory, _ = hook
    cuda_memory._around_profile_available_bytes(lambda self, pre: 1 << 30, _kvc(), 0)
    with caplog.at_level("WARNING"):
        device_budget.note_store("target", _store_bytes(4))
        assert not caplog.records
        device_budget.note_store("target", _store_bytes(4, 12))     # e.g. a PD decode node's extra rows
    assert "set aside" in caplog.text and "--max-running-requests" in caplog.text


def test_pool_budget_counts_one_lru_table_per_shared_index_group(hook):
    """GLM-5.2's shared-index layers (tiny_glm52: 5 layers, anchors 0 and 3): the budget reserves the store the
    adapter builds, one LRU table per group, not per layer; with MTP the store keeps one per layer again."""
    from transformers import AutoConfig

    from sgl_ess.models import TINY_GLM52_DIR

    cuda_memory, spec = hook
    kvc = _kvc(layers=5)
    hf = AutoConfig.from_pretrained(TINY_GLM52_DIR)
    hf.index_topk, hf.num_nextn_predict_layers = 8, 1
    kvc.model_config.hf_config = hf

    def store(anchors=(), verify_rows=0):
        cfg = StoreConfig(num_layers=5, row_bytes=656, host_capacity_tokens=1, hot_slots_per_request=20,
                          max_requests=8, topk=8, max_context_tokens=1024, verify_rows_per_request=verify_rows,
                          layer_anchors=anchors)
        return sum(cfg.device_allocation().values())

    avail = 1 << 30
    grouped = store((0, 0, 0, 3, 3))
    assert grouped < store()                                      # the groups' LRU tables are fewer
    assert cuda_memory._around_profile_available_bytes(lambda self, pre: avail, kvc, 0) == avail - grouped
    spec.speculative_algorithm, spec.speculative_num_draft_tokens = "EAGLE", 4
    scratch = 4 + (4 * 8 - 20)
    got = cuda_memory._around_profile_available_bytes(lambda self, pre: avail, kvc, 0)
    assert got == avail - store(verify_rows=scratch) - _store_bytes(1, verify_rows=scratch)
