"""Issue 32 item 7, the shared host pool (pools/shared_host_pool.py): `check_lockstep` reads the device once
per forward (one device -> host copy of locations, request rows and sequence lengths joined on the device,
not three), and a count mismatch under the stream order is refused on the reader's host before a
`cuStreamWaitValue64` (which has no timeout) is queued: the owner's host posts each count whose stream
write it queued, and a reader's host waits for that post (LockstepError after the timeout)."""
import os

import pytest
import torch

from sgl_ess.integration.sglang.pools import shared_host_pool as shp
from sgl_ess.memory.shared_segment import SharedSegment
from tests.unit.store.device_copies import OnDevice, on_device


class _Group:
    def __init__(self, answers):
        self.answers = answers

    def all_gather_object(self, obj):
        return [obj] + self.answers(obj)


SEGMENT_BYTES_PER_LAYER = 16        # build()'s count segment: the stream-written count and the posted one


def _share(answers, layers=1, **posted):
    seg = SharedSegment(SEGMENT_BYTES_PER_LAYER * layers, label=shp.EPOCHS_LABEL)
    return shp.Share(writer=True, members=[0, 1], group_rank=0, node_rank=0, inode=1,
                     epochs=shp.WriteEpochs(seg, layers), group=_Group(answers), **posted), seg


def test_check_lockstep_copies_the_forward_to_the_host_once():
    share, _ = _share(lambda obj: [obj])
    loc, reqs, seq_lens = (on_device(torch.tensor(v)) for v in ([10, 11, 12], [1, 2], [5, 7]))
    OnDevice.seen.clear()
    share.check_lockstep(loc, reqs, seq_lens)
    assert OnDevice.seen == ["cpu"], f"device -> host copies per forward: {OnDevice.seen}"


def test_the_digest_tells_a_shifted_boundary_apart():
    """Joining the three tensors must not make (loc [1, 2], reqs [3]) fold like (loc [1], reqs [2, 3])."""
    a, _ = _share(lambda obj: [obj])
    b, _ = _share(lambda obj: [obj])
    a.check_lockstep(torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4]))
    b.check_lockstep(torch.tensor([1]), torch.tensor([2, 3]), torch.tensor([4]))
    assert a._digest != b._digest


def test_the_guard_compares_the_per_layer_counts():
    """Equal digests, but a member whose per-layer write/wait counts differ (a layer skipped): stopped."""
    share, _ = _share(lambda obj: [(obj[0], obj[1], obj[2], tuple(c + 1 for c in obj[3]))])
    with pytest.raises(shp.LockstepError, match="different rows"):
        for i in range(shp.GUARD_EVERY):
            share.check_lockstep(torch.tensor([i]), torch.tensor([1]), torch.tensor([5]))


def _stream_pair(layers=2):
    """An owner and a reader share one count segment; each orders through its own compute stream (the
    stream double: a stream wait on a value nobody writes would spin, as a GPU would hang)."""
    from tests.stream_doubles import DeviceComputeStreams

    assert shp.EPOCHS_BYTES_PER_LAYER == SEGMENT_BYTES_PER_LAYER
    owner, seg = _share(lambda obj: [obj], layers, posted=True)
    reader = shp.Share(writer=False, members=[0, 1], group_rank=1, node_rank=0, inode=1,
                       epochs=shp.WriteEpochs(SharedSegment.attach(os.dup(seg.fd),
                                                                   SEGMENT_BYTES_PER_LAYER * layers,
                                                                   label=shp.EPOCHS_LABEL), layers),
                       group=_Group(lambda obj: [obj]), posted=True)
    rts = DeviceComputeStreams(0), DeviceComputeStreams(1)
    owner.order_on(rts[0])
    reader.order_on(rts[1])
    return owner, reader, rts


def _value_waits(rt) -> int:
    return sum(1 for s in rt.streams for op in s.ops if op[0] == "value")


def test_a_count_the_owner_never_queued_is_refused_on_the_host_before_the_stream_wait():
    owner, reader, rts = _stream_pair()
    owner.after_write(1)
    reader.epochs.wait(1, timeout_s=1.0)                 # posted: the stream wait is queued
    assert _value_waits(rts[1]) == 1
    with pytest.raises(shp.LockstepError, match="layer 1"):
        reader.epochs.wait(1, timeout_s=0.05)            # forward 2 of layer 1: the owner never queued it
    assert _value_waits(rts[1]) == 1, "a stream wait nothing will satisfy was queued (cuStreamWaitValue64 hangs)"


def test_posted_counts_keep_the_stream_order():
    """The post is stored after the owner queued its stream write: the reader's stream still waits for the
    owner's stream (a post is not a write of the rows)."""
    owner, reader, rts = _stream_pair()
    rows, seen = torch.zeros(4, dtype=torch.int64), []
    for step in (1, 2, 3):
        def store(step=step):
            rows[step] = step
        rts[0].launch(rts[0].current(), store)
        owner.after_write(0)
        reader.before_read(0)

        def read(step=step):
            seen.append(int(rows[step]))
        rts[1].launch(rts[1].current(), read)
    rts[1].progress(50)                                  # the reader's GPU first: it waits on the value
    assert seen == []
    rts[0].finish()
    rts[1].finish()
    assert seen == [1, 2, 3]
