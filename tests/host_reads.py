"""Seeing host reads on CPU: ops that would make a CUDA host wait for the device.

`HostReads` is a dispatch mode that records every ATen op which reads a device value on the host
(item(), bool(), int()) or whose output shape depends on one (nonzero, unique, masked_select,
boolean-mask indexing). On CPU those cost nothing, so a GPU fake can only catch them this way.
`watch(monkeypatch)` returns one that does not record device work (see there). `.tolist()` does
not dispatch and is not seen.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

HOST_READS = {"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero", "aten::_unique2",
              "aten::unique_dim", "aten::unique_consecutive", "aten::masked_select", "aten::equal"}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in HOST_READS or (name == "aten::index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or []))):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def watch(monkeypatch) -> HostReads:
    """A HostReads that does not see device work: the side streams' kernels (run late by the
    stream double) and the torch reference of a kernel whose CUDA version is one Triton launch
    (FlashTrans: its torch path compacts with a boolean mask, the Triton kernel skips -1 entries)."""
    from sgl_ess.kernels import flashtrans
    from tests.stream_doubles import LateStreams

    def unwatched(fn):
        def run(*a, **k):
            with _disable_current_modes():
                return fn(*a, **k)
        return run

    monkeypatch.setattr(LateStreams, "_step", unwatched(LateStreams._step))
    monkeypatch.setattr(flashtrans, "copy_rows_torch", unwatched(flashtrans.copy_rows_torch))
    return HostReads()
