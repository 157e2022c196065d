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
