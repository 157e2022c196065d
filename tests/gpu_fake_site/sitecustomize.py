"""GPU fake for a whole server (tests only): with SGLESS_TEST_GPU_FAKE=1 and this directory on
PYTHONPATH, every process of `python -m sgl_ess.launch_server --attention-backend dsa` on this CPU
runs the CUDA path's classes: SGLang's DSA backend replaced by ESS's CUDA subclass
(cuda_backend.backend_class, as cuda_backend.register does on a GPU), the store on the CUDA
side-stream engine (prefetch/stream_engine.StreamEngine) whose streams complete work late and out of
order (tests/stream_doubles.LateStreams). Swapped, and nothing else: FlashMLA -> the torch sparse
MLA (tests/integration/_cuda_fake.flash_mla_stub, reading FP8 rows by FlashMLA's layout), MTP verify's
fp32 torch attention -> float64 (both as the CPU path accumulates, so outputs compare exactly), SGLang's
FP8 quantizer (Triton) -> its formula in torch, FlashAttention's varlen MHA -> torch, SGLang's
get_device_sm -> 90,
its seqlens Triton kernel -> torch, SGLang's fused top-k transform (physical slots for its own DSA
backend, ESS off) -> _cuda_fake.ref_fused_topk_transform over the torch indexer's positions, the CPU platform's refusal of an FP8 MLA KV cache
(KVCacheConfigurator.configure asks current_platform.is_cpu()) -> an H200's answer (not a CPU),
our Triton decode -> its torch reference, the device capability
-> (9, 0), the stream runtime -> the late double; and the CPU graph runner's padding value (a method
SGLang asks of backends on a CPU device) answered by the class's CUDA one. Python runs sitecustomize at start, so SGLang's
spawned processes (scheduler, detokenizer) get the same fakes; each is installed right after the
module it patches is first imported."""
import os
import sys

if os.environ.get("SGLESS_TEST_GPU_FAKE") == "1":
    import importlib.abc

    _REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if _REPO not in sys.path:
        sys.path.append(_REPO)

    def _dsa_backend(mod):
        from tests.integration._cuda_fake import ref_quantize_k_cache, ref_seqlens_expand

        mod.quantize_k_cache = ref_quantize_k_cache         # SGLang's FP8 writer's formula (flashmla_kv)
        mod.seqlens_expand_triton = ref_seqlens_expand
        from tests.integration._cuda_fake import ref_flash_attn_varlen

        mod.flash_attn_varlen_func = ref_flash_attn_varlen     # FA3's varlen MHA (MHA one-shot on sm_90)
        from sgl_ess.integration.sglang.backends.cuda_backend import backend_class

        cls = backend_class()                                 # its base: SGLang's class, read before this
        # SGLang asks a backend on a CPU device for the CPU graph runner's padding value (DP attention
        # pads with it); its DSA backend, CUDA-only, has the CUDA method alone: the same value
        cls.get_cpu_graph_seq_len_fill_value = lambda self: self.get_cuda_graph_seq_len_fill_value()
        mod.DeepseekSparseAttnBackend = cls

    def _memory_pool(mod):
        from tests.integration._cuda_fake import ref_quantize_k_cache, ref_quantize_k_cache_separate

        mod.quantize_k_cache = ref_quantize_k_cache         # an FP8 pool's writes: SGLang's formula, torch
        mod.quantize_k_cache_separate = ref_quantize_k_cache_separate

    def _triton_decode(mod):
        from sgl_ess.attention.reference import sparse_mla_decode

        mod.sparse_mla_decode_triton = sparse_mla_decode

    def _latent_store(mod):
        make = mod.LatentStore._make_engine

        def _make_engine(self, name):
            if self.device.type != "cpu":
                return make(self, name)
            from sgl_ess.prefetch.stream_engine import StreamEngine
            from tests.stream_doubles import LateStreams

            return StreamEngine(self.memory, "torch", device="cpu", runtime=LateStreams(os.getpid()),
                                zero_backend="torch")
        mod.LatentStore._make_engine = _make_engine

    def _torch_cuda(mod):
        mod.get_device_capability = lambda *a, **k: (9, 0)

    def _sglang_utils_common(mod):
        # SGLang's sm number (NVML / torch.cuda; 0 without CUDA): an H200's, so the DSA backend's
        # prefill dispatch (set_dsa_prefill_impl: MHA one-shot for short prompts) decides as on sm_90
        mod.get_device_sm = lambda: 90

    class _PlatformAsH200In:
        """SGLang's ``current_platform`` as one function sees it on an H200: ``is_cpu()`` asked directly
        by `function` answers False, as a GPU platform does; every other attribute, and is_cpu() of
        every other caller, is the real (CPU) platform's."""

        def __init__(self, platform, function: str):
            self._platform, self._function = platform, function

        def is_cpu(self) -> bool:
            if sys._getframe(1).f_code.co_name == self._function:
                return False
            return self._platform.is_cpu()

        def __getattr__(self, name):
            return getattr(self._platform, name)

    def _kv_cache_configurator(mod):
        # SGLang's CPU platform refuses an FP8 KV cache for MLA at the top of KVCacheConfigurator.configure
        # ("CPU FP8 KV cache is only supported for MHA": current_platform.is_cpu() there); an H200 has no
        # such guard, so the question asked by configure() itself is answered as on a GPU (not a CPU).
        # Every other caller of this module's current_platform (the MHA quant method, the pool class
        # table) still gets the CPU platform's answers.
        mod.current_platform = _PlatformAsH200In(mod.current_platform, "configure")

    def _indexer_torch(mod):
        # the torch indexer (CPU path of SGLang's Indexer) answers token positions; SGLang's CUDA
        # indexer, with its default fused top-k transform, answers physical slots to a backend whose
        # metadata asks for them (SGLang's own DSA backend, ESS off): that kernel stood in
        from tests.integration._cuda_fake import ref_fused_topk_transform

        native = mod.indexer_forward_native

        def indexer_forward_native(self, x, q_lora, positions, forward_batch, layer_id, return_indices=True, **kw):
            out = native(self, x, q_lora, positions, forward_batch, layer_id, return_indices, **kw)
            return out if out is None else ref_fused_topk_transform(out, forward_batch, layer_id)
        mod.indexer_forward_native = indexer_forward_native

    def _flash_mla_stub(mod):
        from tests.integration._cuda_fake import FLASH_MLA_MODULE, flash_mla_stub

        sys.modules[FLASH_MLA_MODULE] = flash_mla_stub()

    _PATCHES = {"sglang.kernels.ops.attention": _flash_mla_stub,
                "sglang.srt.layers.attention.dsa_backend": _dsa_backend,
                "sglang.srt.mem_cache.memory_pool": _memory_pool,
                "sglang.srt.mem_cache.kv_cache_configurator": _kv_cache_configurator,
                "sgl_ess.kernels.sparse_mla_triton": _triton_decode,
                "sgl_ess.integration.sglang.backends.indexer_torch": _indexer_torch,
                "sgl_ess.store.latent_store": _latent_store,
                "torch.cuda": _torch_cuda,
                "sglang.srt.utils.common": _sglang_utils_common}

    class _PatchAfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            patch = _PATCHES.get(name)
            if patch is None:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
            run = spec.loader.exec_module

            def exec_module(module, _run=run, _patch=patch):
                _run(module)
                _patch(module)
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _PatchAfterImport())
