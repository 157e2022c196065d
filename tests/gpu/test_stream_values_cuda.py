"""The stream order of a host pool shared by TP ranks on CUDA (issue 17; skipped without CUDA; bench/gpu_check.sh
part 1 runs it): the stream runtime's value operations (kernels/stream_values.py, cuStreamWriteValue64 /
cuStreamWaitValue64 on a count in shared, page-locked host memory) order a reading stream after the
stream that stored the rows, though the writer is held back by a long kernel; and a reader rank's
read-only mapping of the pool registers and reads on the GPU. In the CPU suite the same orderings run
through the stream double (tests/unit/store/test_shared_host_pool.py)."""
import os

import pytest
import torch

from sgl_ess.integration.sglang.pools import shared_host_pool as shp
from sgl_ess.kernels.uva import device_view
from sgl_ess.memory.shared_segment import SharedSegment
from sgl_ess.prefetch.stream_runtime import CudaStreams
from sgl_ess.store import HostLatentPool

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

SLEEP_CYCLES = 200_000_000          # ~0.1 s at 2 GHz: the writer's stream is well behind the reader's


def test_a_stream_waiting_for_the_count_reads_the_rows_the_other_stream_stored_before_it():
    rt = CudaStreams(torch.device("cuda"))
    dev = torch.device("cuda")
    pool = HostLatentPool(1, 4, 64, pin=True)
    rows = device_view(pool.rows[0])
    seg = SharedSegment(8 * 2, label=shp.EPOCHS_LABEL)
    epochs = shp.StreamEpochs(seg, 2, rt)         # one mapping per process (owner and reader are two)
    src = torch.full((64,), 7, dtype=torch.uint8, device=dev)
    out = torch.zeros(64, dtype=torch.uint8, device=dev)
    write_stream, read_stream = rt.stream("high"), rt.stream("low")
    with torch.cuda.stream(write_stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        rows[2].copy_(src)                         # the owner's row store, into host memory (zero copy)
        rt.write_value(write_stream, epochs.values, 1, 1)
    with torch.cuda.stream(read_stream):
        rt.wait_value(read_stream, epochs.values, 1, 1)
        out.copy_(rows[2])
    read_stream.synchronize()
    assert out.eq(7).all(), out[:8]
    write_stream.synchronize()
    assert int(seg.tensor(torch.int64, (2,))[1]) == 1


def test_without_the_wait_the_reader_reads_before_the_row_is_there():
    """The check above can fail: the same reads without the wait see the old row."""
    dev = torch.device("cuda")
    pool = HostLatentPool(1, 4, 64, pin=True)
    rows = device_view(pool.rows[0])
    out = torch.ones(64, dtype=torch.uint8, device=dev)
    write_stream, read_stream = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(write_stream):
        torch.cuda._sleep(SLEEP_CYCLES)
        rows[2].fill_(7)
    with torch.cuda.stream(read_stream):
        out.copy_(rows[2])
    read_stream.synchronize()
    assert out.eq(0).all()
    write_stream.synchronize()


def test_a_readers_read_only_mapping_registers_and_reads_on_the_gpu():
    owner = HostLatentPool(2, 8, 64, pin=True)
    reader = HostLatentPool(2, 8, 64, pin=True, fd=os.dup(owner.segment.fd), readonly=True)
    owner.rows[1, 3] = 9
    view = device_view(reader.rows[1])
    assert view[3].eq(9).all() and not reader.segment.writable
