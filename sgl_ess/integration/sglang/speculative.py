"""EAGLE / NextN (MTP) with the ``ess`` backend: the draft backends, and where each forward
mode's queries sit.

SGLang 0.5.23's EAGLE v2 worker runs, per decode iteration (SGLANG_SEAMS.md §D):
  draft decode   DECODE on the draft runner, ``num_steps - 1`` forwards through the multi-step
                 container's per-step child backends (``attn_backends[i]``, each entered with
                 ``forward_context``); ``seq_lens`` = the committed length L for every step, the
                 step writes its speculative row at position L + i, and attention reads
                 positions < L (as SGLang's DSA backend does);
  verify         TARGET_VERIFY on the target runner: ``n = num_draft_tokens`` query tokens per
                 request at positions L .. L+n-1, ``seq_lens`` = L (committed), rows of the whole
                 window written before attention, one causal top-k row per query token;
  draft extend   DRAFT_EXTEND_V2 on the draft runner: the same window, ``seq_lens`` = L + n.
After verify the committed length becomes L + accept_len; rows at the rejected positions stay in
the pools until the next window overwrites them (before anything reads them).

The draft backend factory (``DraftBackendFactory``) picks backends from two hard-coded dicts;
``_around_create_backend`` adds ``ess`` to them (HookRegistry patch, patches/README.md). Each
backend is built by ``backend_registration.create_ess_backend(draft_runner)``, so the draft
runner gets its own store (one adapter per model runner, lifecycle.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import targets

# Roles an ess backend instance plays in a speculative server (set by the factory below).
ROLE_TARGET = "target"            # the target runner's backend (extend, decode, verify)
ROLE_DRAFT_EXTEND = "draft_extend"  # draft runner: prefill extend and DRAFT_EXTEND_V2
ROLE_DRAFT_DECODE = "draft_decode"  # draft runner: one step of the multi-step draft


@dataclass(frozen=True)
class QueryLayout:
    """Where a forward's query tokens sit, per request (host lists, one entry per request).

    kv_lens:    tokens a query may see at most (causal bound of its last query token + 1)
    n_q:        query tokens of the request in this forward
    committed:  leading positions whose rows are final (accepted / prefilled): rows at
                positions >= committed are this forward's own (speculative or just written)
    """

    kv_lens: list[int]
    n_q: list[int]
    committed: list[int]

    def first_query_pos(self) -> list[int]:
        return [kv - n for kv, n in zip(self.kv_lens, self.n_q)]


def num_draft_tokens(forward_batch) -> int:
    spec = getattr(forward_batch, "spec_info", None)
    n = getattr(spec, "draft_token_num", None)
    if n is None:
        from sglang.srt.runtime_context import get_spec

        n = get_spec().speculative_num_draft_tokens
    return int(n)


def _extend_lens(forward_batch) -> list[int]:
    ext = forward_batch.extend_seq_lens_cpu
    if ext is None:
        ext = forward_batch.extend_seq_lens.tolist()
    return [int(x) for x in ext]


def query_layout(forward_batch) -> QueryLayout:
    """QueryLayout of a forward batch in any mode the ess backend serves (host sync: seq_lens)."""
    seq_lens = forward_batch.seq_lens_cpu
    if seq_lens is None:
        seq_lens = forward_batch.seq_lens.cpu()
    s = [int(x) for x in seq_lens.tolist()]
    mode = forward_batch.forward_mode
    if mode.is_decode_or_idle():
        return QueryLayout(s, [1] * len(s), s)
    if mode.is_target_verify():
        n = num_draft_tokens(forward_batch)
        return QueryLayout([x + n for x in s], [n] * len(s), s)
    ext = _extend_lens(forward_batch)
    if mode.is_draft_extend_v2():
        return QueryLayout(s, ext, [x - n for x, n in zip(s, ext)])
    return QueryLayout(s, ext, [x - n for x, n in zip(s, ext)])


class EssMultiStepDraftBackend:
    """The multi-step draft decode container (the shape of ``DeepseekSparseAttnMultiStepBackend``):
    one ess backend per draft step, all sharing the draft runner's store."""

    needs_cpu_seq_lens: bool = True

    def __init__(self, draft_runner, topk: int, speculative_num_steps: int):
        from .backend_registration import create_ess_backend

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
    from .backend_registration import create_ess_backend

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


def _before_nextn_post_load(model, *args, **kwargs):
    """The embedded model's MTP layer (sgl_ess/models/mtp_init.py), only with the scaled dummy init."""
    import logging
    import os

    from .dummy_init import ENV

    if os.environ.get(ENV) == "scaled":
        from sgl_ess.models.mtp_init import shape_mtp_layer

        changed = shape_mtp_layer(dict(model.named_parameters()))
        logging.getLogger(__name__).info("embedded MTP layer shaped: %s", changed)
    return None



def _after_internal_state(result, *args, **kwargs):
    """/ess/status and /health also show the other model runners' stores (the EAGLE draft's)
    under ``draft``; runs after lifecycle's hook, which fills ``ess`` with the target's."""
    from . import lifecycle

    others = lifecycle.all_adapters()[1:]
    ess = result.internal_state.get("ess")
    if others and isinstance(ess, dict):
        ess["draft"] = [a.usage() for a in others]
    return result


def register_status() -> None:
    """Call after lifecycle.register() (AFTER hooks run in registration order)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(targets.INTERNAL_STATE, _after_internal_state, HookType.AFTER)
