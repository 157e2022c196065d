"""Which rows of a forward batch are real requests, and which are SGLang's padding.

SGLang pads a batch in three places: DP attention pads every rank to a common token count (and
an idle rank runs a fabricated one-request extend), Two-Batch Overlap pads each child, and graph
runners pad to a captured size. Padding requests point at request row 0 (which may be a live
request's row) and write their tokens to location 0, the location SGLang's allocator never hands
out. So a request is padding when its first token's location is 0, and padding always follows
the real requests; tokens past the real requests' query tokens are padding too.

The store must never see a padding row: it would open, plan or commit for request row 0. Every
seam that hands rows to the store (the backends' forwards, the indexer's early hand-off) reads
``real_rows`` first. One host read of ``out_cache_loc`` per forward batch, cached.
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


def compute(forward_batch, n_q: list[int]) -> RealRows:
    """RealRows of `forward_batch` whose requests have `n_q` query tokens each (host sync)."""
    loc = forward_batch.out_cache_loc
    total_tok = int(loc.shape[0]) if loc is not None else sum(n_q)
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


def real_rows(forward_batch) -> RealRows:
    """RealRows of `forward_batch` (cached per batch object)."""
    key = id(forward_batch)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is forward_batch:
        return hit[1]
    rows = compute(forward_batch, query_layout(forward_batch).n_q)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (forward_batch, rows)
    return rows
