"""RequestTable: request ids -> hot-buffer rows and token positions -> host locations.

For callers without an engine allocator of their own (tests, benchmarks, the prefetch worker).
SGLang brings its own (`req_to_token`), and uses LatentStore directly.

Memory: `req_to_host int64 [max_requests, max_context_tokens]` on the store's device (-1 where
unused), owned here. Host rows are taken from the store's host pool on `add`/`extend` and given
back, zeroed, on `release` (finish or abort) - nothing outlives its request.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import torch

from sgl_ess.store.latent_store import LatentStore


class RequestTable:
    def __init__(self, store: LatentStore):
        cfg = store.cfg
        self.store = store
        self.req_to_host = torch.full((cfg.max_requests, cfg.max_context_tokens), -1,
                                      dtype=torch.int64, device=store.device)
        self._row_of: dict[Hashable, int] = {}
        self._len: dict[Hashable, int] = {}
        self._free_rows = list(range(cfg.max_requests - 1, -1, -1))

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._row_of

    def __len__(self) -> int:
        return len(self._row_of)

    def add(self, req_id: Hashable, num_tokens: int) -> int:
        """Admit a request with `num_tokens` prompt tokens: a row, host rows, an empty hot buffer."""
        if req_id in self._row_of:
            raise KeyError(f"request id {req_id!r} already exists")
        if num_tokens <= 0 or num_tokens > self.store.cfg.max_context_tokens:
            raise ValueError(f"request {req_id!r}: {num_tokens} prompt tokens; expected 1.."
                             f"{self.store.cfg.max_context_tokens} (max_context_tokens / --context-length)")
        if not self._free_rows:
            raise RuntimeError(f"all {self.store.cfg.max_requests} request rows are in use; "
                               "finish a request first or raise --max-running-requests")
        locs = self.store.host.alloc(num_tokens)  # raises HostPoolFullError, nothing changed
        row = self._free_rows.pop()
        self.req_to_host[row, :num_tokens] = locs.to(self.req_to_host.device)
        self._row_of[req_id] = row
        self._len[req_id] = num_tokens
        self.store.open(row)
        return row

    def row(self, req_id: Hashable) -> int:
        try:
            return self._row_of[req_id]
        except KeyError:
            raise KeyError(f"request id {req_id!r} does not exist (never added, or already "
                           "finished/aborted)") from None

    def rows(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        return torch.tensor([self.row(r) for r in req_ids], dtype=torch.int64, device=self.store.device)

    def seq_len(self, req_id: Hashable) -> int:
        self.row(req_id)
        return self._len[req_id]

    def seq_lens(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        return torch.tensor([self.seq_len(r) for r in req_ids], dtype=torch.int64, device=self.store.device)

    def host_locs(self, req_id: Hashable) -> torch.Tensor:
        return self.req_to_host[self.row(req_id), :self.seq_len(req_id)]

    def extend(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        """One new token for each request: host rows for it; returns positions int64 [b]."""
        rows = [self.row(r) for r in req_ids]
        for r in req_ids:
            if self._len[r] >= self.store.cfg.max_context_tokens:
                raise ValueError(f"request {r!r} reached max_context_tokens="
                                 f"{self.store.cfg.max_context_tokens}; raise --context-length")
        locs = self.store.host.alloc(len(req_ids))
        pos = torch.tensor([self._len[r] for r in req_ids], dtype=torch.int64)
        self.req_to_host[torch.tensor(rows), pos] = locs.to(self.req_to_host.device)
        for r in req_ids:
            self._len[r] += 1
        return pos.to(self.store.device)

    def release(self, req_id: Hashable) -> None:
        """Finish or abort: zero and free the host rows and the hot buffer."""
        row = self.row(req_id)
        n = self._len.pop(req_id)
        del self._row_of[req_id]
        self.store.host.free(self.req_to_host[row, :n].to("cpu"))
        self.req_to_host[row] = -1
        self.store.close(row)
        self._free_rows.append(row)
