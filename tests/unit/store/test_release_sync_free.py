"""Issue 32 item 7: a request's release (LatentStore.clear_host, on every request finish and radix eviction,
on the scheduler thread) makes no host sync and no pageable copy on a device-stream engine. Before, it
copied the released locations to the host (`.to("cpu")`: a device -> host copy, a sync), read their min
and max there, and the stream engine copied them back from pageable memory. Now they stay on the store's
device (a host tensor is staged through pinned memory) and the range check is a device-side assert.

Seen on CPU through the GPU fake (the CUDA StreamEngine with late streams, tests/stream_doubles.py): the
locations are a tensor subclass that counts every copy to the host and every host read
(tests/unit/store/device_copies.py), HostReads sees ATen host reads, the stream double counts host waits;
the released rows still read zero once the streams ran."""
import pytest
import torch

from sgl_ess.prefetch.stream_engine import StreamEngine
from sgl_ess.store import latent_store
from tests.host_reads import HostReads
from tests.stream_doubles import LateStreams
from tests.unit.store.device_copies import OnDevice, on_device
from tests.unit.store.helpers import make_store, token_rows

LAYERS, RB, CTX = 3, 16, 40


def _store(external=False):
    store, table = make_store(layers=LAYERS, row_bytes=RB, host_tokens=256, n=12, max_requests=4, k=8,
                              max_context=128)
    streams = LateStreams(seed=2)
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
    store.external_host_writer = external
    return store, table, streams


def test_a_release_on_the_stream_engine_reads_nothing_on_the_host():
    store, table, streams = _store()
    try:
        table.add("a", CTX)
        locs = table.host_locs("a").clone()
        for layer in range(LAYERS):
            store.write_host(layer, locs, token_rows(locs, RB, salt=layer) | 1)
        store.close(table.index("a"))
        plans = []
        submit = store.engine.submit

        def seen(plan):
            plans.append(plan)
            return submit(plan)
        store.engine.submit = seen
        syncs, device_locs = streams.host_syncs, on_device(locs.to(torch.int32))
        OnDevice.seen.clear()
        with HostReads() as reads:
            store.clear_host(device_locs)
        assert OnDevice.seen == [], f"device -> host copies or host reads of the locations: {OnDevice.seen}"
        assert reads.seen == [], f"host reads in a release: {reads.seen}"
        assert streams.host_syncs == syncs
        (plan,) = plans
        assert plan.kind == "zero" and plan.dst_idx.device == store.device and plan.dst_idx.dtype == torch.int64
        streams.finish()
        assert int(store.host.rows[:, locs].count_nonzero()) == 0, "the released rows were not zeroed"
    finally:
        store.shutdown()


def test_an_out_of_range_release_is_refused_by_the_device_check():
    store, _, _ = _store()
    try:
        with pytest.raises(RuntimeError, match=r"clear_host: a released location is out of range \[0, 256\)"):
            store.clear_host(torch.tensor([3, 256]))
    finally:
        store.shutdown()


def test_host_locations_reach_an_accelerator_through_pinned_memory(monkeypatch):
    """A host tensor bound for a CUDA store is copied into pinned memory before its non-blocking copy (a
    pageable host -> device copy makes the host wait). On CPU: pin_memory and the copy are recorded."""
    calls = []

    def pin(self):
        calls.append(("pin", self.dtype))
        return self

    real_to = torch.Tensor.to

    def to(self, *a, **k):
        if a and isinstance(a[0], torch.device) and a[0].type == "meta":
            calls.append(("to", k.get("non_blocking", False)))
            return torch.empty(self.shape, dtype=self.dtype, device="meta")
        return real_to(self, *a, **k)
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    out = latent_store.index_to_device(torch.tensor([1, 2], dtype=torch.int32), torch.device("meta"))
    assert calls == [("pin", torch.int64), ("to", True)] and out.device.type == "meta"
