"""EAGLE / MTP draft backends of DeepSeek-V4 on CPU: SGLang's DraftBackendFactory builds the ``dsv4`` draft
decode container and draft extend backend from CUDA / HIP / NPU classes (speculative/draft_utils.py,
_create_dsv4_decode_backend and _create_dsv4_prefill_backend); on a CPU draft runner these build the CPU
arm instead (cpu_backend.py). Every backend of one runner shares that runner's rows (cpu_backend's
per-runner state), so the draft decode steps see the window rows the draft extend and earlier steps wrote.
"""

from __future__ import annotations


class DeepseekV4CpuMultiStepDraftBackend:
    """The multi-step draft decode container (SGLang's DeepseekV4MultiStepBackend's shape: ``attn_backends``,
    one per draft step, each entered by the EAGLE worker with forward_context)."""

    def __init__(self, draft_runner, topk: int, speculative_num_steps: int):
        from .cpu_backend import DeepseekV4CpuAttnBackend

        if int(topk) != 1:
            raise NotImplementedError("DeepSeek-V4 on CPU: speculative trees are not implemented (chain drafts "
                                      "only: --speculative-eagle-topk 1)")
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = []
        for i in range(speculative_num_steps):
            b = DeepseekV4CpuAttnBackend(draft_runner)
            b.draft_step = (i, speculative_num_steps)
            self.attn_backends.append(b)

    def init_forward_metadata(self, forward_batch):
        for b in self.attn_backends:
            b.init_forward_metadata(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self.init_forward_metadata(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        return None

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError("DeepSeek-V4 on CPU: no CUDA graphs (run with --disable-cuda-graph)")


def _cpu(factory) -> bool:
    return str(factory.draft_model_runner.device).startswith("cpu")


def around_draft_decode(original_fn, factory, *args, **kwargs):
    if not _cpu(factory):
        return original_fn(factory, *args, **kwargs)
    return "dsv4", DeepseekV4CpuMultiStepDraftBackend(factory.draft_model_runner, factory.topk,
                                                      factory.speculative_num_steps)


def around_draft_extend(original_fn, factory, *args, **kwargs):
    if not _cpu(factory):
        return original_fn(factory, *args, **kwargs)
    from .cpu_backend import DeepseekV4CpuAttnBackend

    return "dsv4", DeepseekV4CpuAttnBackend(factory.draft_model_runner)
