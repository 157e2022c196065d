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

Which steps are captured (issue 35 item 3), each through SGLang's own graph hooks on the backend:
  * target decode (no MTP): ``StoreForward._decode_graph``;
  * MTP TARGET_VERIFY (SGLang's decode graph runner with capture mode TARGET_VERIFY, bs requests x n
    draft tokens): the backend's ``forward_extend`` of a capture batch goes to ``graph_verify`` below
    (``StoreForward._extend_graph``: padding requests -1 through the store's admission, union plan and
    slot table, committed lengths from the device);
  * EAGLE draft decode steps (SGLang's draft graph runner: every step of the multi-step draft forward in one
    graph): each step's ``forward_decode`` of the capture batch goes to ``graph_draft`` below
    (``decode_committed`` with padding rows -1). SGLang's ``DeepseekSparseAttnMultiStepBackend`` hands its
    step backends a DECODE view at capture (not the batch the steps run with) and calls none of their hooks
    before a replay or after a warm-up, so ESS replaces it by a subclass (cuda_multistep.py) that registers
    the capture batch with every step and calls the store's capture, warm-up and replay hooks once;
  * Two-Batch-Overlap decode: SGLang's ``TboAttnBackend`` hands each child its micro-batch's capture batch
    (slices of the graph's static buffers, ``tbo_parent_token_range`` set) and each child's forwards go to
    ``StoreForward._decode_graph`` over those rows (padding -1), planned in the child's own ring groups
    (``micro_batch_base``); the store's capture / warm-up / replay hooks run once, from the primary;
  * Two-Batch-Overlap MTP TARGET_VERIFY: SGLang splits the verify graph's batch at bs // 2 requests and
    their n draft tokens each (two_batch_overlap.get_token_num_per_seq = draft_token_num); each child's
    ``forward_extend`` of its capture batch goes to ``graph_verify`` over its micro-batch (its requests'
    rows of the padded batch, padding -1), in its own ring groups; the MTP scratch rows are per request row;
  * split fetch (``--ess-tp-split-fetch``): SplitFetch's exchange on the stream engine (a static number of rows,
    prefetch/split_fetch.py), the all-gather included, inside the step that waits for the plan; its counts are
    moved by the replay hook (pool_adapter._host_counts). Checked in the decode step only
    (tests/integration/test_cuda_graph_split_fetch_gpu_fake.py);
  * speculative prefetch, a shared host pool, the EAGLE draft extend (DRAFT_EXTEND_V2, which
    SGLang captures for the DSA backend unless SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH): not captured (refused
    by the launcher, the draft extend again by the backend at capture, the store options by
    ``EssPoolAdapter._check_graph_mode``).
Each captured step is checked on CPU against its eager twin, bit for bit, with the graph double
(tests/integration/test_cuda_graph*_gpu_fake.py); none has been captured on a GPU.
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


def assert_write_positions(loc: torch.Tensor, reqs: torch.Tensor, first_pos: torch.Tensor, n: int,
                           req_to_token: torch.Tensor, what: str) -> None:
    """A graph step's device-side form of store_forward.check_write_positions (padded, no host read; that
    module imports this one): the locations a step writes, loc [b*n], are those of positions first_pos ..
    first_pos + n - 1 of its requests (-1: padding, not checked), else a CUDA device-side assert."""
    pos = first_pos.to(torch.int64).reshape(-1, 1) + torch.arange(n, device=first_pos.device)
    expect = req_to_token[reqs.reshape(-1, 1).clamp(min=0), pos.clamp(min=0)].reshape(-1).to(torch.int64)
    same = (loc.reshape(-1).to(torch.int64) == expect) | (reqs.reshape(-1, 1) < 0).expand(-1, n).reshape(-1)
    torch._assert_async(torch.all(same), f"ESS {what}: the tokens being computed and the cache indices the store "
                        "reads are out of step; refusing to read the wrong rows")


def verify_graph_rows(forward_batch, n: int) -> torch.Tensor:
    """int64 [bs]: a TARGET_VERIFY graph batch's request rows, -1 for SGLang's padding rows, on the device:
    each request's n query tokens are n consecutive entries of ``out_cache_loc``, and a padding request's
    first one is location 0 (padding.py's rule)."""
    bs = forward_batch.req_pool_indices.shape[0]
    first = forward_batch.out_cache_loc[:bs * n].view(bs, n)[:, 0]
    return torch.where(first != 0, forward_batch.req_pool_indices.to(torch.int64), -1)


def graph_verify(fwd, q: torch.Tensor, layer, forward_batch, topk: torch.Tensor, sink=None) -> torch.Tensor:
    """One layer of an EAGLE/MTP TARGET_VERIFY step inside a captured CUDA graph (the target runner's
    graph of ``bs`` requests x n draft tokens, SGLang's decode graph runner with capture mode
    TARGET_VERIFY): the store's union (``EssPoolAdapter.verify``) over the whole padded batch (a Two-Batch-
    Overlap child: its micro-batch's requests and their tokens, planned in ``micro_batch_base``), padding
    requests -1 (found on the device), read by slot by the kernels' ``verify_slots`` (SGLang's FlashMLA
    decode over the slot table), the same launches whatever the batch holds. `fwd` is the backend's
    store_forward.StoreForward; q [bs*n, H*D] absorbed queries; topk int [bs*n, k] positions. Returns
    [bs*n, H*R]; the padding requests' tokens read no slot (their table rows are all -1), for which FlashMLA
    returns zero (flashmla_lse.py). Everything the eager verify reads on the host
    (SGLang's count of real tokens, the committed lengths from ``seq_lens_cpu``) is read on the device:
    committed = ``seq_lens`` (TARGET_VERIFY's seq_lens are the committed lengths, query_layout.py)."""
    from .query_layout import ROLE_TARGET, num_draft_tokens

    b = fwd.backend
    if b.spec_role != ROLE_TARGET or not forward_batch.forward_mode.is_target_verify():
        raise RuntimeError("ESS CUDA graphs: graph_verify serves the target runner's TARGET_VERIFY step only")
    by_slot = getattr(fwd.kernels, "verify_slots", None)
    if by_slot is None:
        raise RuntimeError("ESS CUDA graphs: a captured MTP verify reads the union by slot (kernels.verify_slots)")
    n = num_draft_tokens(forward_batch)        # fixed per captured graph (SGLang's num_tokens_per_bs)
    reqs = verify_graph_rows(forward_batch, n)
    bs = reqs.shape[0]
    committed = forward_batch.seq_lens[:bs].to(torch.int64)
    if layer.layer_id == 0:
        assert_write_positions(forward_batch.out_cache_loc[:bs * n], reqs, committed, n, fwd.r2t,
                               forward_batch.forward_mode.name)
        fwd.ess.graphs.note_width(n)           # a replay writes n latent rows per real request
    kw = {} if sink is None else {"sink": sink}
    return fwd.ess.verify(layer.layer_id, reqs, committed, topk.reshape(bs, n, topk.shape[-1]), fwd.r2t, None,
                          micro_batch=b.micro_batch_base,
                          attend_slots=lambda rows, slots: by_slot(q, layer, rows, slots, **kw), padded=True)


def graph_draft(fwd, q: torch.Tensor, layer, forward_batch, topk: torch.Tensor, sink=None) -> torch.Tensor:
    """One layer of an EAGLE draft decode step (step ``speculative_step_id`` of the draft runner's multi-step
    forward) inside a captured CUDA graph: the store's committed-rows decode (``EssPoolAdapter.decode_committed``:
    accepted rows admitted, then planned and attended over the slot space; the step's own speculative row is
    neither read nor admitted) over the whole padded batch, padding rows -1 (found on the device from this
    step's ``out_cache_loc``), the same launches whatever the batch holds. `fwd` is the step backend's
    StoreForward; q [bs, H*D]; topk int [bs, k] positions (< seq_lens, the committed lengths). Returns
    [bs, H*R] in q's dtype; padding rows read no slot (planned padded), for which FlashMLA returns zero and a
    DA / DBA merge of such parts gives zero (attention/overlap.py)."""
    from .query_layout import ROLE_DRAFT_DECODE, num_draft_tokens

    b = fwd.backend
    if b.spec_role != ROLE_DRAFT_DECODE or not forward_batch.forward_mode.is_decode():
        raise RuntimeError("ESS CUDA graphs: graph_draft serves the draft runner's DECODE steps only")
    reqs = graph_rows(forward_batch)
    bs = reqs.shape[0]
    seq_lens = forward_batch.seq_lens[:bs]
    if layer.layer_id == 0:         # step i writes its (speculative) row at position seq_len + i
        assert_write_positions(forward_batch.out_cache_loc[:bs], reqs, seq_lens + b.speculative_step_id, 1, fwd.r2t,
                               "EAGLE draft decode step")
        fwd.ess.graphs.note_width(b.speculative_step_id + 1)   # a replay of steps 0..i writes i + 1 rows per request
    q3 = q.reshape(bs, layer.tp_q_head_num, fwd.kv_lora_rank + fwd.rope_dim)
    out = fwd.ess.decode_committed(id(forward_batch), layer.layer_id, q3, reqs, seq_lens, topk, fwd.r2t,
                                   fwd.attend_slots(layer, sink), max_admit=num_draft_tokens(forward_batch),
                                   micro_batch_base=b.micro_batch_base, single_call=fwd.kernels.single_call,
                                   padded=True)
    return out.to(q.dtype).reshape(bs, layer.tp_q_head_num * fwd.kv_lora_rank)


class GraphBatches:
    """The forward batches SGLang captures decode graphs with (one per captured size), by identity."""

    def __init__(self):
        self._batches: dict[int, object] = {}

    def add(self, forward_batch) -> None:
        self._batches[id(forward_batch)] = forward_batch

    def __contains__(self, forward_batch) -> bool:
        return self._batches.get(id(forward_batch)) is forward_batch
