"""The SGLang API that MTP inside decode CUDA graphs with ESS (--ess-cuda-graph, backends/cuda_graph.py,
backends/cuda_multistep.py) relies on: how SGLang's EAGLE draft graph runner and its DSA multi-step draft
container call the attention backends, and when it captures the draft extend. A SGLang upgrade that changes
any of them fails here, naming it, instead of on the first GPU run (the steps themselves run in
test_cuda_graph_verify_gpu_fake.py and test_cuda_graph_draft_gpu_fake.py)."""

import inspect

import pytest

pytestmark = pytest.mark.integration

sglang = pytest.importorskip("sglang")


def test_the_draft_container_is_built_by_name_and_builds_its_steps_from_the_module_global():
    """ESS's REPLACE of the container (and of the DSA class) reaches the draft runner: the factory imports the
    container from dsa_backend when it builds it, and the container builds each step backend by the module's
    name DeepseekSparseAttnBackend (so the steps are ESS's class)."""
    from sglang.srt.layers.attention import dsa_backend
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    from sgl_ess.integration.sglang.backends.cuda_multistep import multistep_class

    src = inspect.getsource(DraftBackendFactory._create_dsa_decode_backend)
    assert "from sglang.srt.layers.attention.dsa_backend import" in src and "DeepseekSparseAttnMultiStepBackend(" in src
    base = dsa_backend.DeepseekSparseAttnMultiStepBackend
    assert "DeepseekSparseAttnBackend(" in inspect.getsource(base.__init__)
    assert issubclass(multistep_class(), base)
    # SGLang's container has no warm-up hook of its own (ours adds it) and hands its steps a view at capture
    assert "on_after_cuda_graph_warmup" not in base.__dict__
    src = inspect.getsource(base.init_forward_metadata_out_graph)
    assert "build_inner_fb_view(" in src and "init_forward_metadata_out_graph(\n                    inner_fb" in src


def test_sglangs_draft_graph_runner_calls_the_container_as_the_fake_does():
    """The draft graph runner: the container's out_graph(forward_batch, in_capture=True) with the batch the draft
    forward then runs every step with, its warm-up hook if it has one, and out_graph(view with num_padding)
    before each replay; the draft forward swaps out_cache_loc per step on that same batch."""
    from sglang.srt.speculative import eagle_draft_cuda_graph_runner as runner
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    cls = runner.EAGLEDraftCudaGraphRunner
    src = inspect.getsource(cls.capture_one_shape)
    assert "self.draft_attn_backend.init_forward_metadata_out_graph(\n                forward_batch, in_capture=True" in src
    assert 'getattr(\n                self.draft_attn_backend, "on_after_cuda_graph_warmup", None' in src
    assert "self.eagle_worker.draft_forward(forward_batch)" in src
    src = inspect.getsource(cls.execute)
    assert "SimpleNamespace(**vars(forward_batch), num_padding=bs - raw_bs)" in src
    assert "buffers.out_cache_loc.zero_()" in src and "buffers.req_pool_indices.zero_()" in src
    src = inspect.getsource(EagleDraftWorker.draft_forward)
    assert "forward_batch.out_cache_loc = out_cache_loc[i]" in src
    assert "attn_backend=self.draft_attn_backend.attn_backends[i]" in src


def test_sglang_captures_the_draft_extend_unless_its_env_says_not():
    """The draft extend graph (DRAFT_EXTEND_V2), which ESS does not hold, is captured for a DSA draft extend
    backend unless SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH: the variable the launcher sets with MTP."""
    from sglang.srt.environ import envs
    from sglang.srt.speculative import eagle_draft_extend_cuda_graph_runner as ext
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    from sgl_ess.integration.sglang.launcher.launcher_defaults import DRAFT_EXTEND_GRAPH_OFF

    assert hasattr(envs, DRAFT_EXTEND_GRAPH_OFF)
    src = inspect.getsource(EagleDraftWorker._capture_cuda_graphs)
    assert f"not envs.{DRAFT_EXTEND_GRAPH_OFF}.get()" in src
    assert "graph_supported_backend_types.append(DeepseekSparseAttnBackend)" in src
    assert "self.forward_mode = ForwardMode.DRAFT_EXTEND_V2" in inspect.getsource(ext)
