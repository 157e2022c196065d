"""GPU fake of tests/gpu/test_store_stream_cuda.py::test_decode_on_cuda_matches_reference: the same body
(tests/gpu/decode_check.py) on the CUDA StreamEngine with the stream double (side streams late and out
of order, run when the host waits) and the torch kernels, FP8 656-byte rows, at smaller shapes. Issue 32,
defect 5: the GPU test checked both dba halves against the last snapshot, taken after half 0's commit had
zeroed its ring rows; here (side streams run where the snapshot blocks the host) that logic failed for
dba, as it would have on the GPU."""
import pytest
import torch

from sgl_ess.attention.reference import sparse_mla_decode
from sgl_ess.kernels.latent_layout import LatentLayout
from sgl_ess.prefetch.stream_engine import StreamEngine
from sgl_ess.store import LatentStore, RequestTable, StoreConfig
from tests.gpu.decode_check import decode_matches_reference
from tests.stream_doubles import LateStreams

LAY = LatentLayout("fp8_flashmla", 512, 64)
K, N, LAYERS, STEPS, SCALE = 16, 40, 2, 3, 0.05
CONTEXTS = [400, 70, 250, 30]


def _store(seed: int):
    cfg = StoreConfig(num_layers=LAYERS, row_bytes=LAY.row_bytes, host_capacity_tokens=sum(CONTEXTS) + 64,
                      hot_slots_per_request=N, max_requests=8, topk=K, max_context_tokens=1024, ring_slots=20)
    store = LatentStore(cfg, transfer_backend="torch", engine="inline")
    streams = LateStreams(seed)
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
    return store, RequestTable(store), streams


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_gpu_fake_decode_matches_reference(mode):
    store, tab, streams = _store(seed=3)
    try:
        decode_matches_reference(store, tab, LAY, mode, lambda q, rows, sl: sparse_mla_decode(q, rows, sl, LAY, SCALE),
                                 streams.finish, contexts=CONTEXTS, steps=STEPS, k=K, scale=SCALE, heads=4,
                                 host_blocks=streams.finish)
        assert store.engine.stats()["tiers"]["immediate"]["rows"] > 0      # rows really came from the host
    finally:
        store.shutdown()
