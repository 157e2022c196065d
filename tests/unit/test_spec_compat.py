"""Launch-time refusals (integration/sglang/launcher/compat.py): every unsupported combination names its
flag and why; supported ones pass; the ESS config's enable_mtp / enable_two_batch_overlap keys
must agree with SGLang's own flags (unset follows them)."""
from types import SimpleNamespace

import pytest

from sgl_ess.config import EssConfig
from sgl_ess.integration.sglang.launcher.compat import refusals


def _args(**kw):
    base = dict(speculative_algorithm=None, speculative_eagle_topk=None, speculative_draft_attention_backend=None,
                enable_multi_layer_eagle=False, enable_mixed_chunk=False, enable_two_batch_overlap=False)
    return SimpleNamespace(**{**base, **kw})


EAGLE = dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1)


@pytest.mark.parametrize("args, cfg", [
    (_args(), EssConfig()),
    (_args(**EAGLE), EssConfig()),
    (_args(**EAGLE), EssConfig(enable_mtp=True)),
    (_args(speculative_algorithm="NEXTN", speculative_eagle_topk=1), EssConfig()),
    (_args(enable_mixed_chunk=True), EssConfig()),
    (_args(**{**EAGLE, "speculative_eagle_topk": 4}), EssConfig(enabled=False)),     # ESS off: SGLang decides
])
def test_supported(args, cfg):
    assert refusals(args, cfg, has_cuda=False) == []


@pytest.mark.parametrize("args, cfg, needles", [
    (_args(**{**EAGLE, "speculative_eagle_topk": 4}), EssConfig(), ["--speculative-eagle-topk 4", "chain", "1"]),
    (_args(speculative_algorithm="NGRAM"), EssConfig(), ["--speculative-algorithm NGRAM", "EAGLE"]),
    (_args(**EAGLE, speculative_draft_attention_backend="triton"), EssConfig(),
     ["--speculative-draft-attention-backend triton", "own store"]),
    (_args(**EAGLE, enable_mixed_chunk=True), EssConfig(), ["--enable-mixed-chunk", "speculative"]),
    (_args(**EAGLE, enable_multi_layer_eagle=True), EssConfig(), ["--enable-multi-layer-eagle"]),
    (_args(), EssConfig(enable_mtp=True), ["enable_mtp is true", "--speculative-algorithm"]),
    (_args(**EAGLE), EssConfig(enable_mtp=False), ["enable_mtp is false", "--speculative-algorithm EAGLE"]),
    (_args(), EssConfig(enable_two_batch_overlap=True), ["enable_two_batch_overlap is true"]),
    (_args(enable_two_batch_overlap=True), EssConfig(enable_two_batch_overlap=False),
     ["--enable-two-batch-overlap", "is false"]),
    (_args(enable_two_batch_overlap=True), EssConfig(), ["--enable-two-batch-overlap", "CPU", "GPUs"]),
])
def test_refused_naming_flag_and_reason(args, cfg, needles):
    msg = " ".join(refusals(args, cfg, has_cuda=False))
    for n in needles:
        assert n in msg, f"{n!r} missing from: {msg}"


def test_speculative_algorithm_enum_is_read_by_name():
    algo = SimpleNamespace(name="EAGLE")
    assert refusals(_args(speculative_algorithm=algo, speculative_eagle_topk=1), EssConfig(), False) == []


@pytest.mark.parametrize("args, needles", [
    (_args(**EAGLE, speculative_draft_attention_backend="triton"),
     ["--speculative-draft-attention-backend triton", "CUDA", "DSA backend"]),
])
def test_refused_on_cuda_until_the_store_serves_them(args, needles):
    """An MTP draft on another backend than SGLang's DSA one would read the host pool over PCIe."""
    msg = " ".join(refusals(args, EssConfig(), has_cuda=True))
    for n in needles:
        assert n in msg, f"{n!r} missing from: {msg}"
    assert refusals(args, EssConfig(enabled=False), has_cuda=True) == []


def test_mixed_chunk_served_on_cuda_through_the_store():
    """Riding decode rows of a mixed chunked-prefill batch take the store's decode path on CUDA too
    (tests/integration/test_cuda_backend_gpu_fake.py), so --enable-mixed-chunk is no longer refused."""
    assert refusals(_args(enable_mixed_chunk=True), EssConfig(), has_cuda=True) == []


@pytest.mark.parametrize("draft_backend", [None, "dsa"])
def test_mtp_served_on_cuda_through_the_store(draft_backend):
    """Issue 16, items 3 and 4: verify, draft extend and draft decode run through the store on CUDA
    (tests/integration/test_cuda_backend_gpu_fake.py), so EAGLE with one chain is no longer refused."""
    assert refusals(_args(**EAGLE, speculative_draft_attention_backend=draft_backend), EssConfig(),
                    has_cuda=True) == []
