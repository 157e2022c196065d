"""Random weights that keep activations alive, for the embedded tiny model.

SGLang's ``--load-format dummy`` fills every parameter with U(-1e-3, 1e-3): norms near zero,
so the logits are flat (every token ~ -ln(vocab)) and attention barely reaches the output,
which would make "ESS on == ESS off" a weak check. With ``SGLESS_DUMMY_INIT=scaled`` (the
launcher sets it for the embedded model) matrices get U(-a, a), a = sqrt(3 / fan_in) (unit
variance outputs), norm weights 1, biases 0. Deterministic: one fixed seed per parameter index.
"""

from __future__ import annotations

import math
import os

import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import targets

ENV = "SGLESS_DUMMY_INIT"


def scaled_dummy_init(model: torch.nn.Module, seed: int = 1234) -> None:
    for i, (name, param) in enumerate(sorted(model.state_dict().items())):
        if not torch.is_floating_point(param):
            continue
        if name.endswith("bias"):
            param.zero_()
        elif param.dim() == 1:
            param.fill_(1.0 if "norm" in name else 0.0)
        else:
            g = torch.Generator(device=param.device)
            g.manual_seed(seed + i)
            a = math.sqrt(3.0 / param.shape[-1])
            tmp = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            tmp.uniform_(-a, a, generator=g)
            param.copy_(tmp.to(param.dtype))


def _around_dummy_init(original_fn, model, *args, **kwargs):
    if os.environ.get(ENV) == "scaled":
        with torch.no_grad():
            return scaled_dummy_init(model)
    return original_fn(model, *args, **kwargs)


def register() -> None:
    HookRegistry.register(targets.DUMMY_WEIGHTS_INIT, _around_dummy_init, HookType.AROUND)
