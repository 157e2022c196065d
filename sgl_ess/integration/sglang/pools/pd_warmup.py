"""PD: the prefill's warm hot-buffer state travels with the KV to the ESS decode node.

A colocated ESS server warms each request's hot buffers from the top-k of the prefill's last W
query positions (pool_adapter.after_extend). In a prefill/decode split no extend runs on the
decode node, so without this every request would start cold there. Both roles run ESS: the
prefill node warms as a colocated server does; when SGLang writes the request's first-token
metadata (``MetadataBuffers.set_buf``) it also writes that warm state, as each layer's hot-buffer
tokens in LRU order (``LatentStore.lru_tokens``), into one more metadata buffer; SGLang's own
transfer (Mooncake, NIXL: every registered metadata buffer) carries it beside the output ids; the
decode node keeps it when it commits the transfer (``DecodeTransferQueue._commit_transfer_to_req``)
and, when the request first runs, opens its hot buffer with the same LRU state and fetches those
rows from its host pool, where the KV has landed (pool_adapter.open_pending: requests in transfer
hold no hot buffer).

Wire row (int32): a header [MAGIC, layers, hot slots N, seq_len, room lo, room hi, 0, 0], then
layers x N positions (request-relative, so both nodes' own locations apply). That is the closed
form: (8 + L x N) x 4 bytes per request, capped by the hot buffer; the raw alternative (the last
W rows of top-k) is L x W x index_topk x 4.

The buffer is the last metadata buffer; SGLang pairs metadata buffers by position and stops at the
shorter list, so a peer without ESS (or with ESS off) drops it (SGLang logs the count mismatch
once per peer) and the request starts cold. A row whose header does not match this node (another
layer count or --ess-hot-slots-per-request, another request's room, a state that is not a valid
LRU state) is refused: the request starts cold. Both are counted (``cold_starts``,
``pd_warm_rejected``; health-check requests are not); a warm state is a hint, never needed for
correctness. Item sizes must match for the rows to line up: run the same --ess-hot-slots-per-request on both roles
(``python -m sgl_ess.launch_pd`` does).
"""

from __future__ import annotations

import logging
import os

import torch

from sglang.srt.disaggregation.checksum import is_health_check_req
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from . import lifecycle
from .. import targets

logger = logging.getLogger(__name__)

MAGIC = 0x45535331          # "ESS1"
# Debug stand-in for a transfer that skipped the latent write (tests' negative control): "1" zeroes a
# request's landed latent rows on the decode node when its transfer commits. Never set it in service.
DEBUG_DROP_LANDED_KV = "SGLESS_PD_DEBUG_DROP_LANDED_KV"
HEADER = 8


def _split_room(room: int) -> tuple[int, int]:
    room = int(room) & 0xFFFFFFFFFFFFFFFF
    lo, hi = room & 0xFFFFFFFF, room >> 32
    return (lo - (1 << 32) if lo >= 1 << 31 else lo), (hi - (1 << 32) if hi >= 1 << 31 else hi)


def encode(row: torch.Tensor, room: int, seq_len: int, tokens: torch.Tensor) -> None:
    """Write one request's warm state `tokens` [L, N] into wire row `row` (int32 [8 + L*N])."""
    layers, n = tokens.shape
    lo, hi = _split_room(room)
    row[:HEADER] = torch.tensor([MAGIC, layers, n, seq_len, lo, hi, 0, 0], dtype=torch.int32)
    row[HEADER:] = tokens.reshape(-1).to(torch.int32)


def decode(row: torch.Tensor, room: int, layers: int, n: int) -> tuple[int, torch.Tensor] | str:
    """(seq_len, tokens [L, N] int64, a copy) from wire row `row`, or the reason it is refused ("absent": no ESS
    state was written, e.g. the prefill runs without ESS)."""
    head = row[:HEADER].tolist()
    if head[0] != MAGIC:
        return "absent"
    if head[1] != layers or head[2] != n:
        return (f"the prefill's rows are {head[1]} layers x {head[2]} hot slots, this node's {layers} x {n}: "
                "run both with the same --ess-hot-slots-per-request")
    if (head[4], head[5]) != _split_room(room):
        return "the row belongs to another request (bootstrap room differs)"
    if row.numel() < HEADER + layers * n:
        return "the row is shorter than the header says"
    return int(head[3]), row[HEADER:HEADER + layers * n].reshape(layers, n).to(torch.int64)


# --- hooks ---------------------------------------------------------------------------------
def _after_metadata_init(result, buffers, *args, **kwargs):
    a = lifecycle.active_store()
    if a is None:
        return None
    size = args[0] if args else kwargs["size"]
    width = HEADER + a.layers * a.store_cfg.hot_slots_per_request
    buffers.ess_warm = torch.zeros((size, width), dtype=torch.int32, device=buffers.output_ids.device)
    a.pd_wire_rows = size
    a.pd_wire_row_bytes = width * 4
    return None


def _after_get_buf_infos(result, buffers, *args, **kwargs):
    warm = getattr(buffers, "ess_warm", None)
    if warm is None:
        return None
    ptrs, data_lens, item_lens = result
    return [*ptrs, warm.data_ptr()], [*data_lens, warm.nbytes], [*item_lens, warm[0].nbytes]


def _after_clear_slot(result, buffers, idx, *args, **kwargs):
    warm = getattr(buffers, "ess_warm", None)
    if warm is not None:
        warm[idx, :HEADER] = 0
    return None


def _after_set_buf(result, buffers, req, *args, **kwargs):
    """Prefill node: the request's last chunk ran; its hot buffer holds the warm state."""
    warm = getattr(buffers, "ess_warm", None)
    a = lifecycle.active_store()
    if warm is None or a is None:
        return None
    row = warm[req.metadata_buffer_index]
    pool_row = req.kv.req_pool_idx
    if pool_row is None or not a.is_open(int(pool_row)):
        row[:HEADER] = 0                      # nothing warm to send: the decode starts it cold
        return None
    encode(row, req.bootstrap_room or 0, len(req.origin_input_ids), a.export_warm_state(int(pool_row)))
    if not is_health_check_req(req):      # SGLang's and the router's health checks are not counted
        a.pd_warm_sent += 1
    return None


def _before_commit(queue, decode_req, *args, **kwargs):
    """Decode node: the KV has landed; keep the wire's warm state for the request's first batch,
    which opens its hot buffer warm from it (pool_adapter.open_pending)."""
    a = lifecycle.active_store()
    if a is None:
        return None
    req = decode_req.req
    pool_row = req.kv.req_pool_idx
    warm = getattr(queue.metadata_buffers, "ess_warm", None)
    if pool_row is None or not a.is_pending(int(pool_row)):
        return None
    if os.environ.get(DEBUG_DROP_LANDED_KV) == "1":
        a.debug_zero_rows(int(pool_row), len(req.origin_input_ids))
    got = "absent" if warm is None else decode(warm[decode_req.metadata_buffer_index], req.bootstrap_room or 0,
                                                a.layers, a.store_cfg.hot_slots_per_request)
    a.import_warm_state(int(pool_row), len(req.origin_input_ids), got, counted=not is_health_check_req(req))
    return None


def register() -> None:
    HookRegistry.register(targets.PD_METADATA_INIT, _after_metadata_init, HookType.AFTER)
    HookRegistry.register(targets.PD_METADATA_BUF_INFOS, _after_get_buf_infos, HookType.AFTER)
    HookRegistry.register(targets.PD_METADATA_CLEAR_SLOT, _after_clear_slot, HookType.AFTER)
    HookRegistry.register(targets.PD_METADATA_SET_BUF, _after_set_buf, HookType.AFTER)
    HookRegistry.register(targets.PD_DECODE_COMMIT, _before_commit, HookType.BEFORE)
