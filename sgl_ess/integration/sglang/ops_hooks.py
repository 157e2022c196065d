"""The operations side of the plugin: its own ``sglang.srt.plugins`` entry point (pyproject.toml,
``sgl_ess_ops``), loaded by SGLang in every process next to ``plugin.py``; like it, it registers
nothing outside the processes of ``python -m sgl_ess.launch_server`` (``plugin.ess_process``).

  * ``ess`` is a deterministic-inference backend (official seams
    ``add_deterministic_attention_backend_choices`` and
    ``add_radix_supported_deterministic_attention_backend_choices``): its attention is an fp32
    gather + softmax computed per query; SGLang refuses DeepSeek models under
    --enable-deterministic-inference unless the backend is in both lists. The launcher still
    turns the radix cache off in that mode (prefix-cached extends are not bit-identical to full
    prefills on the CPU torch path; see tests/integration/test_prefix_cache.py).
  * ``Scheduler.get_init_info`` AFTER hook (scheduler_probe.py): memory report, metrics thread.
  * ``ModelRunner.maybe_enable_batch_invariant_mode`` AROUND: SGLang's batch-invariant kernels
    (Triton) exist only for CUDA/XPU and raise on CPU; without such a device deterministic mode
    keeps SGLang's seeded sampling (``sampling_seed``) and skips them, with a warning that
    outputs can still depend on what else is in the batch. SGLang calls the method in every model
    runner; without --enable-deterministic-inference it does nothing and no warning is written.
  * every log record of the process is redacted of secret-shaped values (log_redaction.py).
  * ``init_custom_process_group`` AROUND, where the blocking routes call it: the rendezvous is bounded
    by ``--guard-blocking-timeout-s`` (routes/rendezvous_bound.py).
  * ``Req._check_str_based_finish`` AROUND (launcher-started servers): stop_regex with RE2 within
    a per-request budget (observe/pattern_eval.py, issue 38); ``Scheduler.run_batch`` /
    ``process_batch_result`` AROUND: the step watchdog (observe/scheduler_watchdog.py);
    ``BaseGrammarBackend._init_value_dispatch`` AFTER: a grammar admitting no output is a 400.
  * internal state AFTER hook: adds ``ess_ops`` (token pool live / cached / free, queue) next to
    the store's ``ess`` usage, for /ess/status, /health and the metrics.
"""

from __future__ import annotations

import logging

from . import targets
from .plugin import ess_process

logger = logging.getLogger(__name__)
_loaded = False


def _after_internal_state(result, controller=None, *args, **kwargs):
    from .observe.scheduler_state import gather_ranks, ops_state, rank_identity

    try:
        ops = ops_state(getattr(controller, "scheduler", None))
        ops["rank"] = rank_identity()
        from .observe import slo_hooks

        if slo_hooks.state() is not None:
            ops["slo"] = slo_hooks.state()
        result.internal_state["ess_ops"] = ops
    except Exception:  # noqa: BLE001 - status must not break the scheduler's internal-state reply
        logger.exception("ess_ops internal state")
        ops = None
    # outside the try: the gather is a collective every rank of the group must reach
    ranks = gather_ranks(_rank_summary(result.internal_state, ops))
    if ranks is not None and ops is not None:
        ops["ranks"] = ranks
    return result


def _rank_summary(state: dict, ops: dict | None) -> dict:
    """What one attention-TP rank reports to rank 0 for /ess/status (small: it crosses gloo)."""
    from .pools import lifecycle

    store = lifecycle.active_store()
    ess = store.usage() if store is not None else {}
    keys = ("host_tokens_capacity", "host_bytes", "hot_requests_open", "hot_slots_used", "rows_h2d",
            "host_pool_role", "host_pool_inode", "host_pool_members", "host_pool_order", "split_fetch")
    out = {k: ess[k] for k in keys if k in ess}
    if ops:
        out.update(rank=ops.get("rank"), host_tokens_live=ops.get("host_tokens_live"))
    return out


def _deterministic_inference_on() -> bool:
    """The switch SGLang's own ``maybe_enable_batch_invariant_mode`` reads."""
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().deterministic.enable_deterministic_inference)


def _around_batch_invariant_mode(original_fn, *args, **kwargs):
    import torch

    if not _deterministic_inference_on():
        return original_fn(*args, **kwargs)            # SGLang's method: nothing to enable
    if torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return original_fn(*args, **kwargs)
    logger.warning("--enable-deterministic-inference without CUDA/XPU: seeded sampling is on, SGLang's "
                   "batch-invariant kernels are not (GPU-only): a seeded request reproduces, but its output "
                   "may still depend on the other requests batched with it")
    return None


def is_loaded() -> bool:
    return _loaded


def load_plugin() -> None:
    global _loaded
    if _loaded or not ess_process():
        return
    _loaded = True
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .launcher import log_redaction

    log_redaction.install()                          # every process: no secret in a log line
    from .routes import rendezvous_bound

    rendezvous_bound.register()                      # blocking routes: rendezvous bounded by the guard's timeout
    from sglang.srt.arg_groups.choices import (
        DETERMINISTIC_ATTENTION_BACKEND_CHOICES,
        RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND,
        add_deterministic_attention_backend_choices,
        add_radix_supported_deterministic_attention_backend_choices,
    )

    from .observe.scheduler_probe import _after_get_init_info

    if targets.ESS_BACKEND_NAME not in DETERMINISTIC_ATTENTION_BACKEND_CHOICES:
        add_deterministic_attention_backend_choices([targets.ESS_BACKEND_NAME])
    if targets.ESS_BACKEND_NAME not in RADIX_SUPPORTED_DETERMINISTIC_ATTENTION_BACKEND:
        add_radix_supported_deterministic_attention_backend_choices([targets.ESS_BACKEND_NAME])
    HookRegistry.register(targets.SCHEDULER_INIT_INFO, _after_get_init_info, HookType.AFTER)
    HookRegistry.register(targets.INTERNAL_STATE, _after_internal_state, HookType.AFTER)
    HookRegistry.register(targets.BATCH_INVARIANT_MODE, _around_batch_invariant_mode, HookType.AROUND)
    import os

    from sgl_ess.serving.ops_config import ENV_OPS_JSON

    if os.environ.get(ENV_OPS_JSON):                 # a server started by sgl_ess.launch_server
        from .observe import grammar_check, pattern_eval, scheduler_watchdog

        pattern_eval.register()                      # stop_regex: RE2 within a per-request budget
        scheduler_watchdog.register()                # a step over --guard-step-watchdog-s: logged, /health
        grammar_check.register()                     # a grammar that admits no output: 400, not 500
