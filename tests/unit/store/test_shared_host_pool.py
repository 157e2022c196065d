"""Issue 17: the pieces of the shared TP host pool that need no second rank: the owner's per-layer
write count a reader waits on, the lockstep guard, and a pool mapped from another's descriptor."""

import os

import pytest
import torch

from sgl_ess.integration.sglang.pools import shared_host_pool as shp
from sgl_ess.store import HostLatentPool
from sgl_ess.memory.shared_segment import SharedSegment


def test_a_reader_waits_for_the_owners_rows_and_times_out_when_it_never_writes():
    seg = SharedSegment(8 * 3, label=shp.EPOCHS_LABEL)
    owner = shp.WriteEpochs(seg, 3)
    reader = shp.WriteEpochs(SharedSegment.attach(os.dup(seg.fd), 8 * 3, label=shp.EPOCHS_LABEL), 3)
    owner.written(1)
    reader.wait(1, timeout_s=1.0)                     # the owner is one forward ahead: no wait
    with pytest.raises(shp.LockstepError, match="layer 1"):
        reader.wait(1, timeout_s=0.05)                # forward 2 of layer 1 never written


class _Group:
    """The one collective the guard uses, answering for every member."""

    def __init__(self, answers):
        self.answers = answers

    def all_gather_object(self, obj):
        return [obj] + self.answers(obj)


def _share(answers, node=0):
    seg = SharedSegment(8, label=shp.EPOCHS_LABEL)
    return shp.Share(writer=True, members=[0, 1], group_rank=0, node_rank=node, inode=1,
                     epochs=shp.WriteEpochs(seg, 1), group=_Group(answers))


def _forward(share, loc):
    share.check_lockstep(torch.tensor(loc), torch.tensor([1]), torch.tensor([5]))


def test_the_lockstep_guard_passes_equal_ranks_and_stops_on_a_diverged_one():
    same = _share(lambda obj: [obj])
    for i in range(2 * shp.GUARD_EVERY):
        _forward(same, [10 + i])
    other_node = _share(lambda obj: [(obj[0] + 1, obj[1], obj[2] ^ 1)])     # another node's pool: not compared
    for i in range(shp.GUARD_EVERY):
        _forward(other_node, [10 + i])
    diverged = _share(lambda obj: [(obj[0], obj[1], obj[2] ^ 1)])
    with pytest.raises(shp.LockstepError, match="wrote different rows"):
        for i in range(shp.GUARD_EVERY):
            _forward(diverged, [10 + i])


def test_a_pool_mapped_from_the_owners_descriptor_sees_its_rows_and_is_a_reader():
    owner = HostLatentPool(2, 8, 16)
    reader = HostLatentPool(2, 8, 16, fd=os.dup(owner.segment.fd), readonly=True)
    assert owner.writer and not reader.writer and not reader.segment.writable
    owner.write(1, torch.tensor([3]), torch.full((1, 16), 7, dtype=torch.uint8))
    assert reader.read(1, torch.tensor([3])).eq(7).all()
    assert os.fstat(owner.segment.fd).st_ino == os.fstat(reader.segment.fd).st_ino


# --- the stream order (the stream engine's; CUDA) -------------------------------------------------
def _two_ranks(epochs_kind, seed):
    """An owner and a reader, each with its own compute stream that runs behind its host (the GPU fake
    of two TP ranks' GPUs), sharing one pool's rows and one count segment."""
    from tests.stream_doubles import DeviceComputeStreams

    seg = SharedSegment(8 * 2, label=shp.EPOCHS_LABEL)
    rts = DeviceComputeStreams(seed), DeviceComputeStreams(seed + 1)
    if epochs_kind == "stream":
        owner, reader = shp.StreamEpochs(seg, 2, rts[0]), shp.StreamEpochs(seg, 2, rts[1])
    else:
        owner, reader = shp.WriteEpochs(seg, 2), shp.WriteEpochs(seg, 2)
    return rts, owner, reader


def _forward_on_both(rts, owner, reader, rows, seen, step):
    """One forward of layer 1: the owner's stream stores the row, the count follows; the reader's
    stream waits for it (where the owner writes), then reads the row."""
    def store():
        rows[step] = step                              # each forward's row: a new location
    rts[0].launch(rts[0].current(), store)
    owner.written(1)
    if isinstance(reader, shp.StreamEpochs):
        reader.wait(1)
    else:
        reader.wait(1, timeout_s=0.01)    # the host count: stored when the owner's host queued the row

    def read():
        seen.append(int(rows[step]))
    rts[1].launch(rts[1].current(), read)


@pytest.mark.parametrize("seed", range(6))
def test_gpu_fake_a_readers_stream_reads_the_owners_row_only_after_the_owners_stream_stored_it(seed):
    """Issue 17 (CUDA sharing): with the streams behind their hosts and completing in any order, the
    reader's stream still reads each forward's row after the owner's stream stored it: the count is
    written by the owner's stream after the store and waited for by the reader's stream."""
    rts, owner, reader = _two_ranks("stream", 10 * seed)
    rows, seen = torch.zeros(6, dtype=torch.int64), []
    for step in range(1, 6):
        _forward_on_both(rts, owner, reader, rows, seen, step)
        for _ in range(seed):
            rts[(seed + step) % 2].progress(1)         # the hosts run ahead by a varying number of ops
    _run_both(rts, seed)
    assert seen == [1, 2, 3, 4, 5]


def _run_both(rts, seed):
    """The two GPUs run what they were given, interleaved at random; a stream waiting for a value is
    not ready until the other wrote it."""
    import random

    rng = random.Random(seed)
    while any(s.ops for rt in rts for s in rt.streams):
        order = list(rts)
        rng.shuffle(order)
        if not any(rt.progress(1) for rt in order):
            raise AssertionError("both streams wait: a value nobody will write")


def test_gpu_fake_the_host_count_does_not_order_device_work():
    """Why CUDA needs the stream order: the host count is stored when the owner's host has queued the
    row, not when its stream stored it, so a reader's stream can read the row before it is there."""
    rts, owner, reader = _two_ranks("host", 0)
    rows, seen = torch.zeros(6, dtype=torch.int64), []
    _forward_on_both(rts, owner, reader, rows, seen, 1)
    rts[1].progress(10)                                # the reader's GPU runs first
    _run_both(rts, 0)
    assert seen == [0]                                 # it read the row before the owner stored it


def test_the_store_on_the_stream_engine_orders_the_share_through_its_streams():
    from tests.stream_doubles import LateStreams

    seg = SharedSegment(8 * 3, label=shp.EPOCHS_LABEL)
    share = shp.Share(writer=False, members=[0, 1], group_rank=1, node_rank=0, inode=1,
                      epochs=shp.WriteEpochs(seg, 3), group=_Group(lambda obj: [obj]))
    share.epochs.count[2] = 4                         # forwards before the switch carry over
    assert share.describe()["host_pool_order"] == "host"
    rt = LateStreams()
    share.order_on(rt)
    assert share.describe()["host_pool_order"] == "stream" and share.epochs.count == [0, 0, 4]
    seg.tensor(torch.int64, (3,))[2] = 5              # the owner's stream wrote forward 5 of layer 2
    share.before_read(2)                               # compute-stream wait: satisfied, returns
    assert share.epochs.count[2] == 5


def test_the_sharing_rule_follows_the_flag():
    from sgl_ess.core.parallel_layout import ParallelLayout, shares_host_pool

    assert shares_host_pool("auto", on_cuda=False) and not shares_host_pool("auto", on_cuda=True)
    assert shares_host_pool("on", on_cuda=True) and not shares_host_pool("off", on_cuda=False)
    with pytest.raises(ValueError, match="auto, on or off"):
        shares_host_pool("yes", on_cuda=False)
    lay = ParallelLayout(tp=8)
    assert lay.pools_per_node(shared=shares_host_pool("on", True)) == 1
    assert lay.pools_per_node(shared=shares_host_pool("auto", True)) == 8


class _Tp2Group:
    world_size, rank_in_group = 2, 0


def test_sharing_off_builds_this_ranks_own_pool(monkeypatch):
    import sglang.srt.distributed.parallel_state as ps

    monkeypatch.setattr(ps, "get_attn_tp_group", lambda: _Tp2Group())
    pool, share = shp.build(2, 8, 16, on_cuda=False, lock=False, share_mode="off")
    assert share is None and pool.writer and pool.capacity_tokens == 8
