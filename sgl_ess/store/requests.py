"""RequestTable: request ids -> request indices and token positions -> host locations.

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
        self._index_of: dict[Hashable, int] = {}
        self._len: dict[Hashable, int] = {}
        self._free_indices = list(range(cfg.max_requests - 1, -1, -1))

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._index_of

    def __len__(self) -> int:
        return len(self._index_of)

    def add(self, req_id: Hashable, num_tokens: int) -> int:
        """Admit a request with `num_tokens` prompt tokens: an index, host rows, an empty hot buffer."""
        if req_id in self._index_of:
            raise KeyError(f"request id {req_id!r} already exists")
        if num_tokens <= 0 or num_tokens > self.store.cfg.max_context_tokens:
            raise ValueError(f"request {req_id!r}: {num_tokens} prompt tokens; expected 1.."
                             f"{self.store.cfg.max_context_tokens} (max_context_tokens / --context-length)")
        if not self._free_indices:
            raise RuntimeError(f"all {self.store.cfg.max_requests} request indices are in use; "
                               "finish a request first or raise --max-running-requests")
        locs = self.store.host.alloc(num_tokens)  # raises HostPoolFullError, nothing changed
        req = self._free_indices.pop()
        self.req_to_host[req, :num_tokens] = locs.to(self.req_to_host.device)
        self._index_of[req_id] = req
        self._len[req_id] = num_tokens
        self.store.open(req)
        return req

    def index(self, req_id: Hashable) -> int:
        try:
            return self._index_of[req_id]
        except KeyError:
            raise KeyError(f"request id {req_id!r} does not exist (never added, or already "
                           "finished/aborted)") from None

    def indices(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        return torch.tensor([self.index(r) for r in req_ids], dtype=torch.int64, device=self.store.device)

    def seq_len(self, req_id: Hashable) -> int:
        self.index(req_id)
        return self._len[req_id]

    def seq_lens(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        return torch.tensor([self.seq_len(r) for r in req_ids], dtype=torch.int64, device=self.store.device)

    def host_locs(self, req_id: Hashable) -> torch.Tensor:
        return self.req_to_host[self.index(req_id), :self.seq_len(req_id)]

    def extend(self, req_ids: Sequence[Hashable]) -> torch.Tensor:
        """One new token for each request: host rows for it; returns positions int64 [b]."""
        idx = [self.index(r) for r in req_ids]
        for r in req_ids:
            if self._len[r] >= self.store.cfg.max_context_tokens:
                raise ValueError(f"request {r!r} reached max_context_tokens="
                                 f"{self.store.cfg.max_context_tokens}; raise --context-length")
        locs = self.store.host.alloc(len(req_ids))
        pos = torch.tensor([self._len[r] for r in req_ids], dtype=torch.int64)
        self.req_to_host[torch.tensor(idx), pos] = locs.to(self.req_to_host.device)
        for r in req_ids:
            self._len[r] += 1
        return pos.to(self.store.device)

    def release(self, req_id: Hashable) -> None:
        """Finish or abort: zero and free the host rows and the hot buffer."""
        req = self.index(req_id)
        n = self._len.pop(req_id)
        del self._index_of[req_id]
        self.store.close(req)
        self.store.host.free(self.req_to_host[req, :n].to("cpu"))
        self.req_to_host[req] = -1
        self._free_indices.append(req)
