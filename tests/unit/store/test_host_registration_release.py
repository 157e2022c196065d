"""Issue 32 item 7: the host pool's page-locking (chunked cudaHostRegister) was never given back. A store
that built its own pool releases it at shutdown, after the device is done with the rows; a pool handed
in stays with its owner. On CPU through a CUDA-runtime double (tests/unit/kernels/test_uva_runtime.py)."""
import pytest
import torch

pytest.importorskip("cuda.bindings")

from sgl_ess.kernels import cuda_api  # noqa: E402
from sgl_ess.store import HostLatentPool, LatentStore, StoreConfig  # noqa: E402
from tests.unit.kernels.test_uva_runtime import Runtime  # noqa: E402


@pytest.fixture
def rt(monkeypatch):
    r = Runtime()
    events = []
    monkeypatch.setattr(cuda_api, "runtime", lambda: r)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: events.append("synchronize"))
    r.events = events
    return r


def _cfg():
    return StoreConfig(num_layers=2, row_bytes=16, host_capacity_tokens=64, hot_slots_per_request=12, max_requests=2,
                       topk=4, max_context_tokens=64, pin_host=True)


def test_a_store_gives_back_its_pools_registration_at_shutdown(rt):
    store = LatentStore(_cfg(), transfer_backend="torch", engine="inline")
    assert store.host.registration is not None and len(rt.registered) == 1
    sync_before = len(rt.events)
    store.shutdown()
    assert not rt.registered, "the host pool is still page-locked after shutdown"
    assert rt.events[sync_before:] == ["synchronize"]          # the device was done with the rows first
    assert [c[0] for c in rt.calls] == ["register", "unregister"]
    store.host.close()                                          # idempotent
    assert [c[0] for c in rt.calls] == ["register", "unregister"]


def test_a_pool_handed_in_stays_registered_with_its_owner(rt):
    pool = HostLatentPool(2, 64, 16, pin=True)
    store = LatentStore(_cfg(), transfer_backend="torch", engine="inline", host_pool=pool)
    store.shutdown()
    assert len(rt.registered) == 1
    pool.close()
    assert not rt.registered
