"""PD: the prefill node refuses, at bootstrap, a decode node whose latent rows have another layout.

SGLang 0.5.23's Mooncake sender checks a decode peer's KV item length only with
``--enable-unified-memory``; otherwise a decode node with another row layout (another
``--kv-cache-dtype`` or ``--dtype``: FP8 656-byte rows vs BF16, another page size) is sent rows at the
wrong offsets, and answers from garbage. SGLang does check the peer's *state* buffers at registration
(``MooncakeKVManager._validate_peer_state_layout``) and, on a mismatch, fails every transfer to that
peer with the reason. This adds the latent rows to that check (entry 0 of the KV item lengths: one
page of latent rows, in bytes), wrapped onto each Mooncake KV manager when it is built: a mismatch
becomes SGLang's own rejection, logged once at registration ("Rejecting state transfers to decode
session ...") and carried by each request's failure, so the client gets an error instead of wrong
tokens.

Also, before any KV manager is built: the KV buffers that lie in an ESS host pool (the latent rows:
host_pool_class.get_contiguous_buf_infos gives their host addresses) are NIXL memory kind "DRAM",
not SGLang's default "VRAM", on both roles (SGLang marks its HiSparse host pool the same way on the
decode side; a prefill's kinds must all be alike, and with ESS on there they all are). Mooncake
finds a registered address's kind itself.
"""

from __future__ import annotations

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from .. import targets


def mismatch(src_item_len: int, dst_item_len: int | None, page_size: int | None) -> str | None:
    """The refusal for a decode peer whose latent page is `dst_item_len` bytes (None: unknown, let be)."""
    if dst_item_len is None or int(dst_item_len) == int(src_item_len):
        return None
    per_row = ""
    if page_size:
        per_row = f" ({int(src_item_len) // int(page_size)} vs {int(dst_item_len) // int(page_size)} bytes per row)"
    return (f"latent row layout mismatch: this prefill's KV pages are {int(src_item_len)} bytes, the decode node's "
            f"{int(dst_item_len)}{per_row}; run both roles with the same model, --dtype, --kv-cache-dtype "
            f"and --page-size")


def _checked(validate, manager):
    """`manager._validate_peer_state_layout`, with the latent rows checked too."""
    def wrapper(registration_info, *args, **kwargs):
        fully_checked, found = validate(registration_info, *args, **kwargs)
        if found is not None:
            return fully_checked, found
        lens = list(getattr(manager.kv_args, "kv_item_lens", []) or [])
        if not lens:
            return fully_checked, found
        reason = mismatch(lens[0], getattr(registration_info, "dst_kv_item_len", None),
                          getattr(manager.kv_args, "page_size", None))
        return fully_checked, reason
    return wrapper


def host_mem_kinds(ptrs: list[int], kinds: list[str] | None) -> list[str]:
    """NIXL memory kinds of KV buffers at `ptrs`: "DRAM" for those in an ESS host pool, else the kind
    given (SGLang's default "VRAM")."""
    from .host_pool_class import is_host_address

    kinds = list(kinds) if kinds else ["VRAM"] * len(ptrs)
    return ["DRAM" if is_host_address(int(p)) else k for p, k in zip(ptrs, kinds)]


def _before_manager_init(manager, args, *rest, **kwargs):
    ptrs = list(getattr(args, "kv_data_ptrs", None) or [])
    if ptrs:
        args.kv_data_mem_kinds = host_mem_kinds(ptrs, getattr(args, "kv_data_mem_kinds", None))
    return None


def _after_manager_init(result, manager, *args, **kwargs):
    """Every PD KV manager (one per scheduler): the Mooncake one gets the latent check on its peer
    validation. Hooked on the common base class because importing the Mooncake module itself in every
    process would import prometheus_client before SGLang sets its multiprocess directory."""
    validate = getattr(manager, "_validate_peer_state_layout", None)
    if validate is not None and not getattr(validate, "_sgl_ess_checked", False):
        wrapped = _checked(validate, manager)
        wrapped._sgl_ess_checked = True
        manager._validate_peer_state_layout = wrapped
    return None


def register() -> None:
    HookRegistry.register(targets.PD_KV_MANAGER_INIT, _before_manager_init, HookType.BEFORE)
    HookRegistry.register(targets.PD_KV_MANAGER_INIT, _after_manager_init, HookType.AFTER)
