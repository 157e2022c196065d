"""Random weights that keep activations alive, for the embedded tiny model — the same model on any TP.

SGLang's ``--load-format dummy`` fills every parameter with U(-1e-3, 1e-3): norms near zero,
so the logits are flat (every token ~ -ln(vocab)) and attention barely reaches the output,
which would make "ESS on == ESS off" a weak check. With ``SGLESS_DUMMY_INIT=scaled`` (the
launcher sets it for the embedded model) matrices get U(-a, a), a = sqrt(3 / fan_in) (unit
variance outputs), norm weights 1, biases 0. Deterministic: one fixed seed per parameter index.

TP-consistent (issue 17): a sharded parameter is drawn at its FULL (single-rank) shape with the
single-rank seed and handed to SGLang's own weight loader, which keeps this rank's shard — exactly
what loading a checkpoint does. So ``--tp 2`` (or DP attention, EP) serves the model ``--tp 1``
serves, and multi-rank runs can be compared with a single rank. At TP 1 the full shape is the
parameter's shape and the values are the ones drawn before this change.
Sharded kinds handled: SGLang's linear layers (column / merged column / row parallel), the vocab
embedding and LM head, and the fused-MoE expert weights (TP and EP); anything else is replicated
and drawn at its own shape.
"""

from __future__ import annotations

import logging
import math
import os

import torch

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from .. import targets

ENV = "SGLESS_DUMMY_INIT"
MOE_WEIGHTS = ("w13_weight", "w2_weight")
logger = logging.getLogger("sgl_ess.dummy_init")


def _draw(shape, seed: int, device) -> torch.Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    a = math.sqrt(3.0 / shape[-1])
    out = torch.empty(shape, dtype=torch.float32, device=device)
    out.uniform_(-a, a, generator=g)
    return out


def _load_moe(module, pname: str, param, seed: int) -> None:
    """Full expert tensors [E, 2I, H] (gate | up) and [E, H, I] through FusedMoE's loader."""
    n_exp = int(module.num_experts)
    inter = int(module.intermediate_size_per_partition) * int(module.moe_tp_size)
    hidden = int(module.hidden_size)
    param.zero_()
    if pname == "w13_weight":
        full = _draw((n_exp, 2 * inter, hidden), seed, param.device).to(param.dtype)
        for e in range(n_exp):
            module.weight_loader(param, full[e, :inter], pname, "w1", e)
            module.weight_loader(param, full[e, inter:], pname, "w3", e)
    else:
        full = _draw((n_exp, hidden, inter), seed, param.device).to(param.dtype)
        for e in range(n_exp):
            module.weight_loader(param, full[e], pname, "w2", e)


def _full_shape(module, pname: str, param):
    """The single-rank shape of a sharded weight, or None for a replicated one."""
    if pname != "weight" or not hasattr(param, "weight_loader"):
        return None
    if hasattr(module, "output_size") and hasattr(module, "input_size"):        # LinearBase
        return (int(module.output_size), int(module.input_size))
    if hasattr(module, "org_vocab_size") and hasattr(module, "embedding_dim"):  # vocab / LM head
        return (int(module.org_vocab_size), int(module.embedding_dim))
    return None


def scaled_dummy_init(model: torch.nn.Module, seed: int = 1234) -> None:
    owners = {}
    for module in model.modules():
        for pname, param in module.named_parameters(recurse=False):
            owners[id(param)] = (module, pname)
    by_name = dict(model.named_parameters())
    sharded, own = [], []
    for i, (name, tensor) in enumerate(sorted(model.state_dict().items())):
        if not torch.is_floating_point(tensor):
            continue
        if name.endswith("bias"):
            tensor.zero_()
            continue
        if tensor.dim() == 1 and name.endswith("learnable_sink_param"):    # Hunyuan V4's per-head sinks:
            tensor.copy_(_draw(tuple(tensor.shape), seed + i, tensor.device).to(tensor.dtype))   # distinct, nonzero
            own.append(name)
            continue
        if tensor.dim() == 1:
            tensor.fill_(1.0 if "norm" in name else 0.0)
            continue
        param = by_name.get(name)
        module, pname = owners.get(id(param), (None, None))
        if module is not None and pname in MOE_WEIGHTS and hasattr(module, "intermediate_size_per_partition"):
            _load_moe(module, pname, param, seed + i)
            sharded.append(name)
            continue
        full = _full_shape(module, pname, param) if module is not None else None
        if full is not None and tuple(full) != tuple(param.shape):
            param.zero_()                                  # vocab padding rows stay zero
            param.weight_loader(param, _draw(full, seed + i, param.device).to(param.dtype))
            sharded.append(name)
            continue
        tensor.copy_(_draw(tuple(tensor.shape), seed + i, tensor.device).to(tensor.dtype))
        own.append(name)
    logger.info("scaled init: %d matrices drawn at their full shape and sharded by SGLang's loaders, %d at "
                "their own (replicated) shape: %s", len(sharded), len(own), ", ".join(own))


def _around_dummy_init(original_fn, model, *args, **kwargs):
    if os.environ.get(ENV) == "scaled":
        with torch.no_grad():
            return scaled_dummy_init(model)
    return original_fn(model, *args, **kwargs)


def register() -> None:
    HookRegistry.register(targets.DUMMY_WEIGHTS_INIT, _around_dummy_init, HookType.AROUND)
