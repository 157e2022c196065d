"""Issue 32 item 7: on a device engine SplitFetch cannot read a plan's miss count without a host sync, and
nothing set its exchange size, so every exchange carried all b * k plan entries. The store that installs it
now sizes it (LatentStore.engine -> SplitFetch.size_for_store): at most one ring group's rows per plan (the
store's own budget for a plan's misses, StoreConfig.ring_slots_per_group), split over the ranks. The whole
decode through two ranks - outputs exact, the exchange that size, misses past it read by every rank - is in
tests/unit/prefetch/test_split_fetch.py (stream_gpu_fake)."""
import torch

from sgl_ess.prefetch.split_fetch import SplitFetch
from sgl_ess.prefetch.stream_engine import StreamEngine
from tests.host_reads import HostReads
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import make_store

B, K = 6, 16                                      # a plan holds b * k = 96 entries


def _store(engine="stream", ring_slots=0):
    store, table = make_store(layers=2, row_bytes=16, host_tokens=512, n=40, max_requests=B, k=K,
                              max_context=256, ring_slots=ring_slots)
    if engine == "stream":
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(), zero_backend="torch")
    return store


def _gather_self(t):
    return torch.stack([t, t])


def test_a_device_split_fetch_exchanges_the_stores_miss_budget_not_b_times_k():
    store = _store()
    try:
        ring = store.cfg.ring_slots_per_group          # max(k, b * k / 8) = 16 rows
        store.engine = sf = SplitFetch(store.engine, 0, 2, _gather_self)
        assert sf.cap_rows == -(-ring // 2) == 8
        plan_entries = torch.zeros(B * K, dtype=torch.bool)
        plan_entries[::3] = True                       # 32 misses among 96 entries
        with HostReads() as reads:
            assert sf._cap(plan_entries) == 8          # not ceil(96 / 2) = 48
        assert reads.seen == []
    finally:
        store.shutdown()


def test_an_explicit_cap_and_host_engines_keep_their_sizes():
    store = _store(ring_slots=40)
    try:
        store.engine = sf = SplitFetch(store.engine, 1, 2, _gather_self, cap_rows=3)
        assert sf.cap_rows == 3
    finally:
        store.shutdown()
    store = _store(engine="inline")
    try:
        store.engine = sf = SplitFetch(store.engine, 0, 2, _gather_self)
        assert sf.cap_rows is None                     # a host engine counts the misses on the host
        valid = torch.zeros(B * K, dtype=torch.bool)
        valid[:5] = True
        assert sf._cap(valid) == 3
    finally:
        store.shutdown()
