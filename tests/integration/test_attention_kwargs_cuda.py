"""The CUDA class with ESS on (cuda_backend.py, GPU fake) refuses an attention feature it does not
implement: its decode called FlashMLA with ``attn_sink=None`` and dropped Hunyuan V4's sinks silently.
In-process, no server (the GPU fake of tests/integration/test_cuda_backend_gpu_fake.py)."""

import pytest
import torch

pytest.importorskip("sglang")

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import cuda_batch, cuda_layer  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401
from .test_cuda_backend_gpu_fake import CHUNK, _prefill, _write, gpu_fake  # noqa: E402,F401

pytestmark = pytest.mark.integration


def test_cuda_class_refuses_a_sink_in_prefill_and_decode(gpu_fake):
    backend, runner, stub = gpu_fake
    gen = torch.Generator().manual_seed(5)
    rows, prompts = [1], [120]
    fr.place_requests(runner.req_to_token_pool, rows, [p + 2 for p in prompts])
    _write(runner, rows, [p + 2 for p in prompts], gen)
    sink = torch.zeros(fr.HEADS, dtype=torch.float32)
    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("EXTEND", rows, prompts, r2t[1, prompts[0] - CHUNK:prompts[0]], extend_lens=[CHUNK],
                    prefix_lens=[prompts[0] - CHUNK])
    backend.init_forward_metadata(fb)
    topk = fr.causal_topk(gen, [prompts[0] - CHUNK + j for j in range(CHUNK)])
    with pytest.raises(NotImplementedError, match="attn_sink"):
        backend.forward_extend(fr.query(gen, CHUNK), None, None, cuda_layer(0), fb, save_kv_cache=False,
                               topk_indices=topk, attn_sink=sink)
    _prefill(backend, runner, rows, prompts, gen)        # the same backend serves the request without it
    seq = [prompts[0] + 1]
    fb = cuda_batch("DECODE", rows, seq, torch.stack([r2t[1, seq[0] - 1]]).long())
    backend.init_forward_metadata(fb)
    q, topk = fr.query(gen, 1), fr.causal_topk(gen, [seq[0] - 1])
    calls = len(stub.calls)
    with pytest.raises(NotImplementedError, match="attn_sink"):
        backend.forward_decode(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk,
                               attn_sink=sink)
    assert len(stub.calls) == calls, "FlashMLA ran before the refusal"
    backend.forward_decode(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk)
    assert len(stub.calls) > calls
