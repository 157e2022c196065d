"""Decode CUDA graphs with ESS (``--ess-cuda-graph``). NOT YET RUN ON A GPU: capture and replay are
checked on CPU with a graph double that records a step's tensor ops once and replays them on the
same tensors, refusing host reads, data-dependent shapes and unjoined side-stream work as a real
capture does (tests/graph_double.py, tests/integration/test_cuda_graph_gpu_fake.py).

A replayed graph runs no Python, so an ESS decode step inside one must be the same launches for
every batch of its size:
  * padding rows are found on the device, not sliced off on the host: SGLang resets the padded
    tail of its static ``req_pool_indices`` / ``out_cache_loc`` buffers to 0 before each replay,
    and a padding row writes location 0 (padding.py's rule), so ``graph_rows`` is the request row
    where the location is not 0 and -1 elsewhere; the store takes -1 rows (``padded=True``) and
    touches nothing for them;
  * the side streams fork from the compute stream and join it again at the step's last layer
    (``LatentStore.graph_boundary``); before the capture and before each replay the same join
    orders pending eager work (zeroing of released rows, prefill warmups, commits) ahead of the
    graph and forgets every ticket, so no captured op waits on an event recorded outside the graph;
  * host-side counts a replay cannot move (host writes, rows) are counted in the replay hook.
Which forward batches are graph batches: the ones SGLang hands to ``init_forward_metadata_out_graph``
with ``in_capture=True`` (its capture batches); every other batch takes the eager path.
"""

from __future__ import annotations

import torch

def graph_rows(forward_batch) -> torch.Tensor:
    """int64 [bs]: each decode row's request row, -1 for SGLang's padding rows (location 0), computed
    on the device (a graph's batch is padded to its captured size)."""
    bs = forward_batch.req_pool_indices.shape[0]
    loc = forward_batch.out_cache_loc[:bs]
    return torch.where(loc != 0, forward_batch.req_pool_indices.to(torch.int64), -1)


def replay_rows(fb_view, pending: bool) -> tuple[int, int, list[int] | None]:
    """(captured size, real rows, their request rows or None) of a replay's batch view (SGLang's
    build_replay_fb_view: the padded static buffers, ``num_padding`` of them padding). The request
    rows are read back only when `pending` (a PD decode node has rows waiting to open)."""
    size = int(fb_view.batch_size)
    n = size - int(getattr(fb_view, "num_padding", 0) or 0)
    return size, n, (fb_view.req_pool_indices[:n].tolist() if pending else None)


class GraphBatches:
    """The forward batches SGLang captures decode graphs with (one per captured size), by identity."""

    def __init__(self):
        self._batches: dict[int, object] = {}

    def add(self, forward_batch) -> None:
        self._batches[id(forward_batch)] = forward_batch

    def __contains__(self, forward_batch) -> bool:
        return self._batches.get(id(forward_batch)) is forward_batch
