"""Which rows of a forward batch are real requests, and which are SGLang's padding.

SGLang pads a batch in three places: DP attention pads every rank to a common token count (and
an idle rank runs a fabricated one-request extend), Two-Batch Overlap pads each child, and graph
runners pad to a captured size. Padding requests point at request row 0 (which may be a live
request's row) and write their tokens to location 0, the location SGLang's allocator never hands
out. So a request is padding when its first token's location is 0, and padding always follows
the real requests; tokens past the real requests' query tokens are padding too.

The store must never see a padding row: it would open, plan or commit for request row 0. Every
seam that hands rows to the store (the backends' forwards, the indexer's early hand-off) reads
``real_rows`` first, cached per forward batch. Two ways to find them:
  SGLang's count   ``global_num_token_non_padded_cpu``, the host int SGLang keeps of a batch's real
                   tokens (set before DP / TBO padding, 0 for an idle rank's fabricated batch): no
                   device read. Used on a device batch (CUDA) whenever SGLang set it and the batch is
                   not sequence-sharded.
  the locations    one host read of ``out_cache_loc`` (the rule above), the fallback.
On a CPU batch both are computed and must agree (a read there costs nothing), so every server test
checks SGLang's count against the locations in every mode it runs; a disagreement raises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .query_layout import query_layout

_CACHE: dict[int, tuple[object, "RealRows"]] = {}
_CACHE_SIZE = 8             # a step's batch, its TBO children and a draft's batches


@dataclass(frozen=True)
class RealRows:
    n_req: int              # the first n_req requests are real
    n_tok: int              # their query tokens are the first n_tok tokens
    total_req: int
    total_tok: int

    @property
    def padded(self) -> bool:
        return self.n_req != self.total_req or self.n_tok != self.total_tok


def _total_tokens(forward_batch, n_q: list[int]) -> int:
    loc = forward_batch.out_cache_loc
    return int(loc.shape[0]) if loc is not None else sum(n_q)


def compute(forward_batch, n_q: list[int]) -> RealRows:
    """RealRows of `forward_batch` whose requests have `n_q` query tokens each (host sync)."""
    loc = forward_batch.out_cache_loc
    total_tok = _total_tokens(forward_batch, n_q)
    total_req = len(n_q)
    if loc is None or total_req == 0:
        return RealRows(total_req, sum(n_q), total_req, total_tok)
    firsts, at = [], 0
    for n in n_q:
        firsts.append(at if n > 0 and at < total_tok else -1)
        at += n
    idx = torch.tensor([max(f, 0) for f in firsts], dtype=torch.int64, device=loc.device)
    first_loc = loc[idx].tolist() if total_tok else [0] * total_req
    pad = [f < 0 or int(v) == 0 for f, v in zip(firsts, first_loc)]
    n_req = pad.index(True) if True in pad else total_req
    if not all(pad[n_req:]):
        raise RuntimeError(f"ESS: padding rows of a forward batch are not at its tail (request rows "
                           f"{forward_batch.req_pool_indices.tolist()[:16]}, padding {pad[:16]}); refusing to "
                           "hand a padding row to the store")
    return RealRows(n_req, sum(n_q[:n_req]), total_req, total_tok)


def from_count(forward_batch, n_q: list[int]) -> RealRows | None:
    """RealRows from SGLang's host count of real tokens, or None where it does not say: the first
    requests whose query tokens start before that count are real."""
    n_tok = getattr(forward_batch, "global_num_token_non_padded_cpu", None)
    if n_tok is None or getattr(forward_batch, "attn_tp_sequence_sharded", False):
        return None
    n_req, at = 0, 0
    for n in n_q:
        if n <= 0 or at >= n_tok:
            break
        n_req, at = n_req + 1, at + n
    return RealRows(n_req, sum(n_q[:n_req]), len(n_q), _total_tokens(forward_batch, n_q))


def reads_cost_nothing(loc) -> bool:
    """A host read of `loc` waits for no device (the CPU)."""
    return loc is None or loc.device.type == "cpu"


def real_rows(forward_batch) -> RealRows:
    """RealRows of `forward_batch` (cached per batch object)."""
    key = id(forward_batch)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is forward_batch:
        return hit[1]
    n_q = query_layout(forward_batch).n_q
    counted = from_count(forward_batch, n_q)
    if counted is not None and not reads_cost_nothing(forward_batch.out_cache_loc):
        rows = counted                                  # a device batch: no host read
    else:
        rows = compute(forward_batch, n_q)
        if counted is not None and counted != rows:
            raise RuntimeError(f"ESS: SGLang's count of real tokens ({forward_batch.global_num_token_non_padded_cpu}) "
                               f"gives {counted}, the padding locations give {rows} "
                               f"({forward_batch.forward_mode.name}); the padding rule of padding.py no longer "
                               "matches SGLang's")
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (forward_batch, rows)
    return rows
