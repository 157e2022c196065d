"""Issue 32, defect 1 (the backend's half): the GPU fake answers as an H200 (SGLang's get_device_sm 90,
capability (9, 0)), where SGLang's DSA backend decides per extend batch (set_dsa_prefill_impl) to
prefill short prompts (max kv length <= SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD, 2048) as
dense MHA one-shot: the model then writes the latent rows itself and calls attention without top-k,
so the ESS extend path never runs (no hot buffer opened or warmed, no fence before the write). With
ESS on, the CUDA class turns MHA one-shot off, as SGLang does for its own HiSparse. With ESS off the
same class and batch must pick MHA one-shot: that shows the fake takes the sm_90 branch, so the first
test sees the defect (it failed on the main of 2026-12-03 with use_mha True)."""

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.backends.cuda_backend import backend_class  # noqa: E402

from . import _fake_runner as fr  # noqa: E402
from ._cuda_fake import H200_SM, cuda_batch, cuda_runner, install_gpu_fakes  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401

LAYERS, CHUNK = 2, 16


def _backend(ess_env, monkeypatch, ess_on: bool):
    from sglang.srt.runtime_context import get_parallel

    if ess_on:
        ess_env(hot_slots_per_request=24)
    stub, ov = install_gpu_fakes(monkeypatch, decode_impl="flashmla_kv")
    with get_parallel().override(attn_dcp_rank=0):
        req_pool, alloc = fr.shared_pools()
        backend = backend_class()(cuda_runner(req_pool, alloc, LAYERS))
    return backend, req_pool, ov


def _short_extend(req_pool, rows=(1, 2), prompt=40):
    r2t = req_pool.req_to_token
    return cuda_batch("EXTEND", list(rows), [prompt] * len(rows),
                      torch.cat([r2t[r, prompt - CHUNK:prompt] for r in rows]),
                      extend_lens=[CHUNK] * len(rows), prefix_lens=[prompt - CHUNK] * len(rows))


def test_short_prefill_is_not_dense_mha_with_ess_on(ess_env, monkeypatch):
    import sglang.srt.utils as sgl_utils

    backend, req_pool, ov = _backend(ess_env, monkeypatch, ess_on=True)
    try:
        assert backend.ess is not None and sgl_utils.get_device_sm() == H200_SM
        backend.init_forward_metadata(_short_extend(req_pool))
        assert backend.use_mha is False, ("ESS on: a short prefill went to dense MHA one-shot, bypassing the "
                                          "store (no hot buffer opened, no fence)")
    finally:
        ov.restore()


def test_ess_off_keeps_sglangs_dispatch(monkeypatch, ess_env):
    """With ESS off the CUDA class is SGLang's backend: short prompts stay dense MHA on sm_90."""
    from sgl_ess.integration.sglang.backends import backend_registration

    monkeypatch.setattr(backend_registration, "store_for_runner", lambda runner: None)
    backend, req_pool, ov = _backend(ess_env, monkeypatch, ess_on=True)
    try:
        assert backend.ess is None
        backend.init_forward_metadata(_short_extend(req_pool))
        assert backend.use_mha is True
    finally:
        ov.restore()
