"""Seeing device -> host copies and host reads of a device tensor on CPU, where they dispatch nothing.

`OnDevice` is a tensor subclass that stands for a tensor on an accelerator: every copy of one to the host
(`.cpu()`, `.to("cpu")`) and every host read of one (`.numpy()`, `.tolist()`, `.item()`, `int()`, `bool()`)
is appended to `OnDevice.seen`; what such a copy returns is a plain host tensor, so later host work on it is
not counted. Work on the "device" (indexing, arithmetic, `.to(dtype)`) keeps the subclass.
tests/host_reads.HostReads sees the ATen ops that read a value on the host; this sees the copies too."""
from __future__ import annotations

import torch

HOST_READS = ("numpy", "tolist", "item", "__int__", "__bool__", "__index__", "__float__")


def _to_host(name: str, args, kwargs) -> bool:
    if name == "cpu":
        return True
    if name != "to":
        return False
    targets = list(args[1:]) + [kwargs.get("device")]
    return any(isinstance(a, (str, torch.device)) and torch.device(a).type == "cpu" for a in targets if a is not None)


class OnDevice(torch.Tensor):
    seen: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        out = super().__torch_function__(func, types, args, kwargs)
        if _to_host(name, args, kwargs) or name in HOST_READS:
            cls.seen.append(name)
            if isinstance(out, torch.Tensor):
                out = out.as_subclass(torch.Tensor)
        return out


def on_device(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(OnDevice)
