"""EAGLE / NextN (MTP) with the ``ess`` backend: the draft backends (where each forward mode's
queries sit, and the backends' roles: query_layout.py).

The draft backend factory (``DraftBackendFactory``) picks backends from two hard-coded dicts;
``_around_create_backend`` adds ``ess`` to them (HookRegistry patch, patches/README.md). Each
backend is built by ``backend_registration.create_ess_backend(draft_runner)``, so the draft
runner gets its own store (one adapter per model runner, lifecycle.py).
"""

from __future__ import annotations

from .. import targets
from .backend_registration import create_ess_backend
from .query_layout import ROLE_DRAFT_DECODE, ROLE_DRAFT_EXTEND


class EssMultiStepDraftBackend:
    """The multi-step draft decode container (the shape of ``DeepseekSparseAttnMultiStepBackend``):
    one ess backend per draft step, all sharing the draft runner's store."""

    needs_cpu_seq_lens: bool = True

    def __init__(self, draft_runner, topk: int, speculative_num_steps: int):
        self.topk = topk
        self.speculative_num_steps = speculative_num_steps
        self.attn_backends = []
        for i in range(speculative_num_steps - 1):
            b = create_ess_backend(draft_runner)
            b.spec_role = ROLE_DRAFT_DECODE
            b.speculative_step_id = i
            self.attn_backends.append(b)

    def init_forward_metadata(self, forward_batch):
        for b in self.attn_backends:
            b.init_forward_metadata(forward_batch)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        raise NotImplementedError("ess draft backends run without CUDA graphs (--cuda-graph-backend-decode disabled)")

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        self.init_forward_metadata(forward_batch)

    def init_forward_metadata_in_graph(self, forward_batch) -> None:
        return None


def _ess_draft_decode(factory):
    return "ess", EssMultiStepDraftBackend(factory.draft_model_runner, factory.topk,
                                           factory.speculative_num_steps)


def _ess_draft_extend(factory):
    backend = create_ess_backend(factory.draft_model_runner)
    backend.spec_role = ROLE_DRAFT_EXTEND
    return "ess", backend


def _around_create_backend(original_fn, factory, backend_name, backend_map, error_template,
                           stamps_children=False):
    """Add ``ess`` to the factory's hard-coded map: the multi-step container for the draft
    decode (the only caller with ``stamps_children``), an ess backend for the draft extend."""
    make = _ess_draft_decode if stamps_children else _ess_draft_extend
    backend_map = {**backend_map, targets.ESS_BACKEND_NAME: lambda: make(factory)}
    return original_fn(factory, backend_name, backend_map, error_template, stamps_children=stamps_children)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(targets.DRAFT_BACKEND_CREATE, _around_create_backend, HookType.AROUND)
    HookRegistry.register(targets.NEXTN_POST_LOAD, _before_nextn_post_load, HookType.BEFORE)
    HookRegistry.register(targets.HYV4_NEXTN_POST_LOAD, _before_nextn_post_load, HookType.BEFORE)
    HookRegistry.register(targets.DSV4_NEXTN_POST_LOAD, _before_nextn_post_load, HookType.BEFORE)


def _before_nextn_post_load(model, *args, **kwargs):
    """The embedded model's MTP layer (sgl_ess/models/mtp_init.py), only with the scaled dummy init."""
    import logging
    import os

    from ..launcher.dummy_init import ENV

    if os.environ.get(ENV) == "scaled":
        from sgl_ess.models.mtp_init import shape_mtp_layer

        changed = shape_mtp_layer(dict(model.named_parameters()))
        logging.getLogger(__name__).info("embedded MTP layer shaped: %s", changed)
    return None



def _after_internal_state(result, *args, **kwargs):
    """/ess/status and /health also show the other model runners' stores (the EAGLE draft's)
    under ``draft``; runs after lifecycle's hook, which fills ``ess`` with the target's."""
    from ..pools import lifecycle

    others = lifecycle.all_adapters()[1:]
    ess = result.internal_state.get("ess")
    if others and isinstance(ess, dict):
        ess["draft"] = [a.usage() for a in others]
    return result


def register_status() -> None:
    """Call after lifecycle.register() (AFTER hooks run in registration order)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(targets.INTERNAL_STATE, _after_internal_state, HookType.AFTER)
