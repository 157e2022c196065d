"""Weights of the embedded model's MTP (NextN) layer, shaped on top of the random init.

The embedded model has random weights (``--load-format dummy`` + the scaled init), so a random
NextN layer never guesses the target's next token (measured: 0 accepted drafts in 120 tokens)
and speculative decoding would only ever accept the bonus token. To exercise accepted AND
rejected draft tokens, the MTP layer is shaped (constants below); the target model is untouched
(its parameters, and their init order, do not include the MTP layer).

torch only (no sglang): the integration calls `shape_mtp_layer` on the draft model's parameters.
"""
from __future__ import annotations

import torch

# eh_proj = [EMBED_GAIN * I | HIDDEN_GAIN * I]: the draft starts from the target's last hidden
# state, i.e. it proposes "the token the target just produced" (the random target repeats tokens
# and falls into short cycles on repetitive prompts), moved by its own attention and MoE (x DAMP).
# Chosen on the embedded model: a repetitive prompt accepts drafts (1-3 per step) while the draft's
# attention output still changes draft tokens (DAMP 0 accepts more, 0.25 almost never).
EMBED_GAIN = 0.0
HIDDEN_GAIN = 1.0
DAMP = 0.1
DAMPED = ("o_proj.weight", "down_proj.weight", "w2_weight", "wo_b.weight")   # wo_b: DeepSeek-V4's attention output


@torch.no_grad()
def shape_mtp_layer(params: dict[str, torch.Tensor]) -> list[str]:
    """params: the NextN model's named parameters. eh_proj [H, 2H] -> [EMBED_GAIN*I | HIDDEN_GAIN*I] (DeepSeek-V4's
    NextN splits it: e_proj [H, H] -> EMBED_GAIN*I, h_proj [H, H] -> HIDDEN_GAIN*I, applied to each of its
    hyper-connection copies); the decoder's output projections x DAMP. Returns the names changed."""
    changed = []
    for name, p in params.items():
        if name.endswith("eh_proj.weight"):
            h = p.shape[0]
            eye = torch.eye(h, dtype=torch.float32, device=p.device)
            p.copy_(torch.cat([EMBED_GAIN * eye, HIDDEN_GAIN * eye], dim=1).to(p.dtype))
            changed.append(name)
        elif name.endswith(("e_proj.weight", "h_proj.weight")) and not name.endswith("eh_proj.weight"):
            gain = EMBED_GAIN if name.endswith("e_proj.weight") else HIDDEN_GAIN
            p.copy_((gain * torch.eye(p.shape[0], p.shape[1], dtype=torch.float32, device=p.device)).to(p.dtype))
            changed.append(name)
        elif ".decoder." in name and name.endswith(DAMPED):
            p.mul_(DAMP)
            changed.append(name)
    return changed
