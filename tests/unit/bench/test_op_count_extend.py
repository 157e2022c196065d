"""bench/op_count.py's count of device -> host syncs per prefill (extend) layer-step (issue 32): the
counter must see each kind of sync it claims to count, so an extra one planted in the real extend path
raises the count by exactly one, at the planted site; a read inside a kernel stand-in (one Triton
launch on CUDA) does not. And check_topk, which a prefill layer calls, reads the device once."""
import pytest
import torch

from bench.op_count import count_extend_syncs
from sgl_ess.store import latent_store
from sgl_ess.store.validate import check_topk


def _plant(monkeypatch, read):
    original = latent_store.LatentStore.warmup

    def warmup(self, layer, reqs, seq_lens, topk_ids, req_to_host, **kw):
        read(seq_lens)
        return original(self, layer, reqs, seq_lens, topk_ids, req_to_host, **kw)
    monkeypatch.setattr(latent_store.LatentStore, "warmup", warmup)


@pytest.fixture(scope="module")
def base():
    return count_extend_syncs()


def test_the_sites_add_up_to_the_count(base):
    # the CUDA path (the adapter's validate False): a steady prefill layer reads nothing back
    assert base["syncs"] == 0 and base["sync_sites"] == {}, base


@pytest.mark.parametrize("read,kind", [
    (lambda t: int(t.sum()), "_local_scalar_dense"),          # .item() / int() / bool()
    (lambda t: t.tolist(), "tolist"),
    (lambda t: t.cpu(), "cpu"),
    (lambda t: t[t > 0], "nonzero"),                           # a boolean mask: data-dependent size
])
def test_a_planted_sync_raises_the_count_by_one(monkeypatch, base, read, kind):
    _plant(monkeypatch, read)
    got = count_extend_syncs()
    assert got["syncs"] == base["syncs"] + 1
    planted = [s for s in got["sync_sites"] if "test_op_count_extend.py" in s and s.endswith(f"({kind})")]
    assert len(planted) == 1, got["sync_sites"]


def test_a_read_inside_a_kernel_stand_in_is_not_counted(monkeypatch, base):
    from sgl_ess.prefetch import stream_engine
    original = stream_engine.copy_rows

    def copy_rows(*a, **kw):
        int(torch.zeros(1).sum())           # the torch reference's own read; one Triton launch on CUDA
        return original(*a, **kw)
    monkeypatch.setattr(stream_engine, "copy_rows", copy_rows)
    assert count_extend_syncs()["syncs"] == base["syncs"]


def test_check_topk_reads_the_device_once_on_good_input():
    topk = torch.tensor([[0, 3, -1], [1, 2, 4]])
    seq = torch.tensor([4, 5])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        check_topk(topk, seq, "t")
    assert sum(e.name == "aten::_local_scalar_dense" for e in prof.events()) == 1
