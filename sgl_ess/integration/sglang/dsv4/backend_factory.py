"""``--attention-backend dsv4`` with a CPU arm: SGLang's factory (attention_registry.create_dsv4_backend)
has NPU, HIP and CUDA arms; without CUDA, on a CPU runner, this one builds DeepseekV4CpuAttnBackend
(cpu_backend.py) and otherwise hands over to SGLang's. Registered through SGLang's
``register_attention_backend`` (the official seam), after SGLang's own registration."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def register() -> None:
    from sglang.srt.layers.attention import attention_registry

    sglang_factory = attention_registry.create_dsv4_backend

    def create_dsv4_backend(runner):
        if str(runner.device).startswith("cpu"):
            from .cpu_backend import DeepseekV4CpuAttnBackend

            logger.info("dsv4 attention backend: the CPU arm (sgl-ess, torch)")
            return DeepseekV4CpuAttnBackend(runner)
        return sglang_factory(runner)

    attention_registry.register_attention_backend("dsv4")(create_dsv4_backend)
