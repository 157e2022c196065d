import pytest
import torch

from sgl_ess.store import HostLatentPool, HostPoolFullError


def test_alloc_write_read_free_clears_rows():
    pool = HostLatentPool(num_layers=3, capacity_tokens=10, row_bytes=8)
    locs = pool.alloc(4)
    assert pool.used_tokens == 4 and pool.free_tokens == 6
    data = torch.randint(1, 255, (4, 8), dtype=torch.uint8)
    for layer in range(3):
        pool.write(layer, locs, data + layer)
        assert torch.equal(pool.read(layer, locs), data + layer)
    pool.free(locs)
    assert pool.used_tokens == 0
    assert int(pool.rows.sum()) == 0  # clear-on-release: no user data left behind


def test_full_pool_raises_clear_error_and_keeps_working():
    pool = HostLatentPool(num_layers=1, capacity_tokens=5, row_bytes=4)
    a = pool.alloc(3)
    with pytest.raises(HostPoolFullError, match="asked for 4 token rows, 2 free of 5.*--ess-memory-pool-size-gb"):
        pool.alloc(4)
    assert pool.used_tokens == 3  # the failed call changed nothing
    b = pool.alloc(2)
    assert set(a.tolist()) | set(b.tolist()) == set(range(5))
    pool.free(a)
    with pytest.raises(ValueError, match="double free"):
        pool.free(a)
    assert pool.free_tokens == 3


def test_out_of_range_locations_are_refused():
    pool = HostLatentPool(num_layers=2, capacity_tokens=5, row_bytes=4)
    with pytest.raises(IndexError, match="out of range"):
        pool.write(0, torch.tensor([7]), torch.zeros((1, 4), dtype=torch.uint8))
    with pytest.raises(IndexError, match="layer 2 out of range"):
        pool.read(2, torch.tensor([0]))
    with pytest.raises(ValueError, match=r"uint8 \[1, 4\]"):
        pool.write(0, torch.tensor([0]), torch.zeros((1, 5), dtype=torch.uint8))


def test_rows_live_in_a_shared_segment_another_mapping_sees():
    from sgl_ess.memory.shared_segment import SharedSegment

    pool = HostLatentPool(num_layers=2, capacity_tokens=3, row_bytes=4)
    other = SharedSegment.attach(pool.segment.fd, pool.segment.nbytes)   # what a worker process maps
    view = other.tensor(torch.uint8, (2, 3, 4))
    pool.write(1, torch.tensor([2]), torch.full((1, 4), 7, dtype=torch.uint8))
    assert view[1, 2].tolist() == [7, 7, 7, 7]
    view[0, 0] = 9                                                        # and the other way round
    assert pool.read(0, torch.tensor([0])).tolist() == [[9, 9, 9, 9]]
