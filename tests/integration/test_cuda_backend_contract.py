"""The SGLang API the CUDA ESS backend (cuda_backend.py) calls: the subclass builds from the
installed SGLang, and every private method, field and signature it relies on exists with the
parameters it passes. A SGLang upgrade that moves any of them fails here, naming it, instead of on
the first GPU run. (The class itself runs in test_cuda_backend_gpu_fake.py, kernels swapped.)"""

import dataclasses
import inspect

import pytest

pytestmark = pytest.mark.integration

sglang = pytest.importorskip("sglang")


def _params(fn):
    return list(inspect.signature(fn).parameters)


def test_subclass_builds_and_overrides_what_it_should():
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    from sgl_ess.integration.sglang.backends.cuda_backend import backend_class

    cls = backend_class()
    assert issubclass(cls, DeepseekSparseAttnBackend)
    # every forward SGLang routes to the backend goes through the store (store_forward.StoreForward)
    for name in ("__init__", "init_forward_metadata", "get_indexer_metadata", "forward_extend", "forward_decode"):
        assert name in cls.__dict__, name
    for fn in (DeepseekSparseAttnBackend.forward_decode, DeepseekSparseAttnBackend.forward_extend):
        base = _params(fn)
        assert base[:9] == ["self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache", "q_rope", "k_rope"]
        assert "topk_indices" in base


def test_sglang_internals_the_cuda_path_calls():
    from sglang.srt.layers.attention import dsa_backend as mod
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

    B = mod.DeepseekSparseAttnBackend
    assert _params(B._forward_flashmla_kv)[1:] == ["q_all", "kv_cache", "v_head_dim", "sm_scale", "layer",
                                                   "metadata", "page_table_1"]
    assert {"q_all", "kv_cache", "page_table_1", "sm_scale", "v_head_dim", "topk_length",
            "attn_sink"} <= set(_params(B._forward_flashmla_sparse))
    assert _params(B._pad_topk_indices)[1:] == ["topk_indices", "num_tokens"]
    assert callable(mod.concat_mla_absorb_q_general)
    assert "force_unfused_topk" in {f.name for f in dataclasses.fields(DSAIndexerMetadata)}
    assert _params(Indexer.forward_cuda)[1:6] == ["x", "q_lora", "positions", "forward_batch", "layer_id"]


def test_sglang_internals_the_cuda_memory_hook_calls():
    from sglang.srt.mem_cache.kv_cache_configurator import calculate_mla_kv_cache_dim
    from sglang.srt.model_executor.pool_configurator import DefaultPoolConfigurator

    assert _params(DefaultPoolConfigurator._compute_cell_size)[1:3] == ["kvc", "num_layers"]
    assert {"model_config", "kv_cache_dtype"} <= set(_params(calculate_mla_kv_cache_dim))
