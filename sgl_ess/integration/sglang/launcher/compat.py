"""Launch-time refusal of SGLang flag combinations ESS does not (yet) serve, each naming the flag
and why; and the consistency of the ESS config's ``enable_mtp`` / ``enable_two_batch_overlap``
keys with SGLang's own flags.

Official seam: ``register_resolution_hook("handle_other_validations")`` (SGLang's argument
pipeline, ``arg_groups/resolution_hooks.py``): the check runs after SGLang resolved every flag,
inside ``ServerArgs.resolve_once`` - in the launcher, before any model is loaded - and raises
ValueError, which ``python -m sgl_ess.launch_server`` reports as "SGLang refused the arguments"
(exit code 2).

What is served with ESS on: EAGLE / NEXTN (the model's MTP layer) with one chain of draft tokens
(``--speculative-eagle-topk 1``), the draft runner on the ``ess`` backend on CPU and on SGLang's DSA
backend (ESS's subclass) on CUDA, each with its own store; mixed chunked prefill without
speculation. Two-Batch Overlap's per-micro-batch path is built (child
backends with their own ring groups) but SGLang only runs TBO with expert parallelism or DP
attention across GPUs.
"""

from __future__ import annotations

from typing import Any

from sgl_ess.config import EssConfig, config_from_env
from sgl_ess.core.parallel_layout import ParallelLayout

MTP_ALGORITHMS = ("EAGLE", "NEXTN")


def _flag(value: Any) -> Any:
    return getattr(value, "name", value)       # SpeculativeAlgorithm enum or its string


def refusals(args: Any, cfg: EssConfig, has_cuda: bool) -> list[str]:
    """Every reason the resolved SGLang arguments `args` cannot run with `cfg` (empty: fine)."""
    out = []
    algo = _flag(getattr(args, "speculative_algorithm", None))
    spec = algo not in (None, "", "NONE")
    tbo = bool(getattr(args, "enable_two_batch_overlap", False))
    if cfg.enable_mtp is True and not spec:
        out.append("ess_config.enable_mtp is true but --speculative-algorithm is not set: add --speculative-algorithm "
                   "EAGLE (the model's MTP layer) or drop enable_mtp")
    if cfg.enable_mtp is False and spec:
        out.append(f"--speculative-algorithm {algo} was given but ess_config.enable_mtp is false: remove one of "
                   "them (unset enable_mtp follows the flag)")
    if cfg.enable_two_batch_overlap is True and not tbo:
        out.append("ess_config.enable_two_batch_overlap is true but --enable-two-batch-overlap is not set")
    if cfg.enable_two_batch_overlap is False and tbo:
        out.append("--enable-two-batch-overlap was given but ess_config.enable_two_batch_overlap is false: remove one "
                   "of them (unset follows the flag)")
    if cfg.slo_tpot_ms > 0:
        attn_tp = layout_of(args)[0].attention_tp
        if attn_tp > 1:
            out.append(f"--ess-slo-tpot-ms with attention TP {attn_tp}: the SLO cap is decided from each rank's own "
                       "step times, and the ranks of a TP group must schedule identical batches; use DP attention "
                       "(--attn-dp-size = --tp) or drop --ess-slo-tpot-ms")
        if cfg.slo_itl_percentile > 100:
            out.append(f"--ess-slo-itl-percentile {cfg.slo_itl_percentile:g}: expected a percentile in [1, 100]")
        if spec:
            out.append("--ess-slo-tpot-ms with --speculative-algorithm: a decode step emits several tokens, so a step "
                       "time is not a TPOT; not built")
    if not cfg.enabled:
        return out
    if spec:
        if str(algo).upper() not in MTP_ALGORITHMS:
            out.append(f"--speculative-algorithm {algo} with ESS on: only EAGLE / NEXTN (the model's MTP layer) is "
                       "built; use --speculative-algorithm EAGLE, or --ess-enabled false")
        topk = getattr(args, "speculative_eagle_topk", 1) or 1
        if topk > 1:
            out.append(f"--speculative-eagle-topk {topk} with ESS on: ESS resolves each request's draft tokens as one "
                       "chain (tree drafts reorder rows across branches, so their top-k rows and cache indices "
                       "would not line up); use --speculative-eagle-topk 1")
        draft_backend = getattr(args, "speculative_draft_attention_backend", None)
        if not has_cuda and draft_backend not in (None, "ess"):
            out.append(f"--speculative-draft-attention-backend {draft_backend} with ESS on (CPU): the draft runner "
                       "must use the ess backend (its own store); drop the flag")
        if getattr(args, "enable_multi_layer_eagle", False):
            out.append("--enable-multi-layer-eagle with ESS on: only the single-layer NextN draft is built")
        if getattr(args, "enable_mixed_chunk", False):
            out.append("--enable-mixed-chunk with --speculative-algorithm and ESS on: a speculative request riding in "
                       "a mixed batch is not built; drop one of the two flags")
    if has_cuda and spec:
        draft_backend = getattr(args, "speculative_draft_attention_backend", None)
        if draft_backend not in (None, "dsa", "nsa"):
            out.append(f"--speculative-draft-attention-backend {draft_backend} with ESS on CUDA: the draft runner must "
                       "use SGLang's DSA backend (ESS's subclass, its own store); another backend would read the "
                       "host pool over PCIe. Drop the flag")
    if tbo and not has_cuda:
        out.append("--enable-two-batch-overlap with ESS on this CPU-only machine: SGLang runs TBO only with expert "
                   "parallelism (--moe-a2a-backend deepep) or DP attention across GPUs; the per-micro-batch ESS path "
                   "is tested by driving the two child backends (tests/integration/test_spec_backends.py)")
    return out


def _check(server_args, previous) -> None:
    previous(server_args)
    import torch

    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = config_from_env() or EssConfig()
    reasons = refusals(resolving_view(server_args), cfg, torch.cuda.is_available())
    if reasons:
        raise ValueError("sgl-ess: " + "; ".join(reasons))


def register() -> None:
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook

    if _check not in _HOOKS.get("handle_other_validations", ()):
        register_resolution_hook("handle_other_validations")(_check)


def layout_of(args: Any) -> tuple[ParallelLayout, list[str]]:
    """The parallel layout of SGLang's parsed (not yet resolved) arguments, and its problems."""
    def n(name):
        return int(getattr(args, name, 1) or 1)

    return ParallelLayout.from_sglang(tp=n("tp_size"), dp=n("dp_size"), pp=n("pp_size"), nnodes=n("nnodes"),
                                      dp_attention=bool(getattr(args, "enable_dp_attention", False)),
                                      attn_dp_size=int(getattr(args, "attn_dp_size", 1) or 1))


def parallel_refusals(args: Any) -> list[str]:
    """Parallel layouts SGLang would stop on with a bare assert or error (checked on the parsed
    flags, before SGLang resolves them)."""
    lay, problems = layout_of(args)
    out = [p for p in problems if not p.startswith("--nnodes")]
    if lay.tp * lay.pp % lay.nnodes:
        out.append(f"--nnodes {lay.nnodes} with --tp {lay.tp}: every node runs the same number of ranks, so --tp x --pp "
                   f"must be a multiple of --nnodes")
    return out
