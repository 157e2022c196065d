"""Input checks for the store's public calls. Each message says what was received, what was
expected, and what to change. They read values back to the host, so trusted hot paths may skip
them (`validate=False`)."""
from __future__ import annotations

import torch


def check_topk(topk: torch.Tensor, seq_lens: torch.Tensor, what: str) -> None:
    check_topk_shape(topk, seq_lens, what)
    if topk.numel() == 0:
        return
    # one host read when the input is good (a prefill layer calls this: issue 32's syncs per layer);
    # the error path reads more to say what is wrong
    if bool(topk_invalid(topk, seq_lens)):
        raise_topk_error(topk, seq_lens, what)


def check_topk_shape(topk: torch.Tensor, seq_lens: torch.Tensor, what: str) -> None:
    """Type and shape of a top-k tensor (no device read)."""
    if not isinstance(topk, torch.Tensor) or topk.dtype not in (torch.int32, torch.int64):
        got = topk.dtype if isinstance(topk, torch.Tensor) else type(topk).__name__
        raise TypeError(f"{what}: expected an int32 or int64 tensor of token positions, got {got}")
    if topk.dim() != 2 or topk.shape[0] != seq_lens.numel():
        raise ValueError(f"{what}: expected shape [batch={seq_lens.numel()}, k], got {list(topk.shape)}")


def topk_invalid(topk: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """bool 0-d on topk's device, no host read: some entry of topk int [b, k] is below -1 or not below
    its row's sequence length (seq_lens int [b])."""
    t64 = topk.to(torch.int64)
    over = t64 >= seq_lens.to(topk.device, torch.int64).unsqueeze(1)
    return (over | (t64 < -1)).any()


def raise_topk_error(topk: torch.Tensor, seq_lens: torch.Tensor, what: str) -> None:
    """Raise the error that says what is wrong with topk (reads the device; the error path only)."""
    lo = int(topk.min())
    if lo < -1:
        raise IndexError(f"{what}: position {lo} is negative; only -1 (padding) is allowed")
    over = topk.to(torch.int64) >= seq_lens.to(topk.device, torch.int64).unsqueeze(1)
    if bool(over.any()):
        b = int(over.any(dim=1).nonzero()[0])
        raise IndexError(
            f"{what}: request {b} selects position {int(topk[b].max())} but its context has "
            f"{int(seq_lens[b])} tokens (valid: 0..{int(seq_lens[b]) - 1}, -1 padding); the "
            "indexer's top-k and the store's sequence lengths are out of sync")


def check_rows(rows: torch.Tensor, n: int, row_bytes: int, what: str) -> None:
    if not isinstance(rows, torch.Tensor) or rows.dtype != torch.uint8 or rows.dim() != 2 \
            or rows.shape[1] != row_bytes or rows.shape[0] != n:
        got = f"{rows.dtype} {list(rows.shape)}" if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"{what}: expected uint8 rows [{n}, {row_bytes}] (row_bytes from the latent "
                         f"layout), got {got}")
