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


def test_sglang_decode_graph_seams_the_cuda_path_relies_on():
    """--ess-cuda-graph (backends/cuda_graph.py) relies on SGLang's decode graph runner: the hooks it
    calls on the backend, the replay view's fields, and the padded tail of the static
    req_pool_indices / out_cache_loc buffers reset to 0 before each replay (the padding rule)."""
    import torch
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.cuda_graph_buffer_registry import build_decode_registry
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as runner
    from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend

    from sgl_ess.integration.sglang.backends.cuda_backend import backend_class

    from sglang.srt.environ import EnvBool

    from sgl_ess.integration.sglang.launcher.launcher_defaults import ENV_TRUE

    assert _params(AttentionBackend.init_forward_metadata_out_graph)[1:] == ["forward_batch", "in_capture"]
    assert callable(AttentionBackend.on_after_cuda_graph_warmup)
    for base in backend_class().__mro__[1:]:        # our overrides replace SGLang's, which take no other path
        if "init_forward_metadata_out_graph" in base.__dict__:
            assert _params(base.init_forward_metadata_out_graph)[1:] == ["forward_batch", "in_capture"], base
    # the call sites: out_graph(in_capture=True) before the warm-ups and capture of each size, with the
    # capture batch; the hook after each warm-up; out_graph(view) before each replay
    src = inspect.getsource(runner.DecodeCudaGraphRunner.capture_one_shape)
    assert "attn_backend.init_forward_metadata_out_graph(forward_batch, in_capture=True)" in src
    assert "forward_batch=forward_batch" in src and "on_after_cuda_graph_warmup" in src
    src = inspect.getsource(FullCudaGraphBackend.capture_one)
    assert "post_warmup_hook()" in src and "for warmup_step in range(2)" in src
    assert "attn_backend.init_forward_metadata_out_graph(fb_view)" in inspect.getsource(
        runner.DecodeCudaGraphRunner._init_replay_attn_metadata_from_view)
    # the launcher reads SGLANG_ENABLE_METADATA_GLUE_GRAPH as SGLang does
    parse = EnvBool.parse.__get__(object.__new__(EnvBool))
    for v in ("true", "1", "yes", "y", "TRUE", "Y", "false", "0", "no", "n"):
        assert parse(v) == (v.lower() in ENV_TRUE), v
    assert {"forward_batch", "bs", "raw_bs"} <= set(_params(runner.build_replay_fb_view))
    src = inspect.getsource(runner.build_replay_fb_view)
    assert "num_padding=bs - raw_bs" in src and "req_pool_indices=buffers.req_pool_indices[:bs]" in src
    reg = build_decode_registry(device=torch.device("cpu"), max_bs=4, max_num_token=4, seq_len_fill_value=1,
                                cache_loc_dtype=torch.int64)
    for name in ("req_pool_indices", "out_cache_loc"):
        slot = reg.get_slot(name)
        slot.buffer.fill_(7)                         # a previous, larger replay's rows
        slot.reset_padding(2, 4)
        assert slot.buffer[2:4].tolist() == [0, 0] and slot.buffer[:2].tolist() == [7, 7], name


def test_sglang_gates_dense_mha_one_shot_on_the_flag_the_cuda_path_clears():
    """Issue 32, defect 1: with ESS on, the CUDA class sets supports_mha_one_shot = False so SGLang's
    per-batch prefill dispatch never picks dense MHA one-shot (which bypasses the store). That holds only
    while set_dsa_prefill_impl decides use_mha by that flag; a rename would silently route short
    prompts around ESS again."""
    import re

    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend

    src = inspect.getsource(DeepseekSparseAttnBackend.set_dsa_prefill_impl)
    decision = re.search(r"self\.use_mha = \((.*?)\n\s*\)\n", src, re.S)
    assert decision is not None, "set_dsa_prefill_impl no longer assigns self.use_mha = (...): re-read it"
    assert decision.group(1).lstrip().startswith("self.supports_mha_one_shot"), decision.group(1)[:200]
    assert "self.use_mha = True" not in src      # no other path turns it on
