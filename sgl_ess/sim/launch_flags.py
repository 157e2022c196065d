"""The launcher flags that serve a planned point, and the numbers the launcher's ``--ess-explain`` prints for
them: tokens per host pool, host pools and host bytes per node, hot slots per request per layer.

`plan` prints these so a user can start the planned deployment as planned; tests/unit/sim/
test_launcher_agreement.py runs ``python -m sgl_ess.launch_server ... --ess-explain`` with the same flags
and compares. The rules are the launcher's own: core/parallel_layout (pools per node, bytes per pool,
with one 64-token padding page), the latent row of the dtype the flags name, the host pool's layers =
the model's attention layers (SGLang's num_attention_layers: LongCat-Flash has 2 per decoder layer; an
MTP draft's store is extra, as the launcher says), and hot slots given explicitly
(``--ess-hot-slots-per-request``: the launcher takes the number as given, so the plan's ratio x context
is what the store builds), and with MTP (the plan's --mtp > 1) the EAGLE flags whose draft-token count
sizes the store's MTP scratch rows. The device bytes per GPU are the store's whole allocation for those
flags (store_device.py: hot buffers, rings, MTP scratch rows, LRU tables per anchor layer, token map,
counters), what ``--ess-explain`` prints as "device bytes per GPU (ESS store)". Pure Python; nothing is
started.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .config import ModelSpec, SimConfigError
from .host_pools import HostPoolReport
from .store_device import store_device_allocation

KV_DTYPE_FLAG = {"fp8_e4m3": "fp8_e4m3", "bf16": "bfloat16"}


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]                # flags for python -m sgl_ess.launch_server (besides --model-path)
    tokens_per_pool: int
    pools_per_node: int
    host_bytes_per_node: int
    hot_slots_per_request: int
    max_running_requests: int
    request_rows: int = 0                # the store's request rows on one GPU (running per worker + 1 padding)
    device_allocation: tuple[tuple[str, int], ...] = ()   # the store's device bytes per GPU, by tensor

    @property
    def device_bytes_per_gpu(self) -> int:
        return sum(v for _, v in self.device_allocation)

    def as_dict(self) -> dict:
        return {"argv": list(self.argv), "tokens_per_pool": self.tokens_per_pool,
                "pools_per_node": self.pools_per_node, "host_bytes_per_node": self.host_bytes_per_node,
                "hot_slots_per_request": self.hot_slots_per_request,
                "max_running_requests": self.max_running_requests, "request_rows": self.request_rows,
                "device_bytes_per_gpu": self.device_bytes_per_gpu,
                "device_allocation": dict(self.device_allocation)}


def hot_slots(m: ModelSpec, ratio: float, context: int) -> int:
    """GPU slots per request per attention layer for a sparse-memory ratio (all of the context at 1.0)."""
    return max(m.topk_tokens + 1, math.ceil(ratio * context)) if m.topk_tokens else context


def lru_tables(m: ModelSpec) -> int:
    """LRU slot tables of the store: one per anchor layer (StoreConfig.layer_anchors groups the shared-index
    layers after an anchor onto its table); every attention layer without shared-index layers."""
    layers = m.num_layers * m.attention_sublayers
    if m.index_anchor_layers < 0:
        return layers
    if m.index_anchor_layers == 0:
        raise SimConfigError(f"{m.name}: dense MLA (no indexer): no ESS store to size")
    if m.attention_sublayers != 1:
        raise SimConfigError(f"{m.name}: shared-index layers with {m.attention_sublayers} attention layers per decoder "
                         "layer: not modelled")
    return m.anchors


def mtp_flags(mtp: int) -> list[str]:
    """SGLang's EAGLE flags for `mtp` tokens verified per step (one chain: mtp - 1 draft steps, top-1)."""
    if mtp <= 1:
        return []
    return ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", str(mtp - 1), "--speculative-eagle-topk",
            "1", "--speculative-num-draft-tokens", str(mtp)]


def launch_plan(rep: HostPoolReport, m: ModelSpec, batch: int, ratio: float, context: int,
                mtp: int = 1) -> LaunchPlan:
    """Flags and launcher numbers for `batch` requests per GPU (per DP-attention worker) at `ratio`, with
    `mtp` tokens verified per request per step (1: no speculative decoding)."""
    lay = rep.layout
    workers = lay.dp if lay.dp_attention else 1
    running = batch * workers
    slots = hot_slots(m, ratio, context)
    pools = rep.for_sharing(rep.chosen)
    argv = ["--tp", str(lay.tp), "--dp", str(lay.dp)] + (["--enable-dp-attention"] if lay.dp_attention else [])
    argv += ["--nnodes", str(lay.nnodes), "--max-total-tokens", str(rep.tokens_per_pool),
             "--max-running-requests", str(running), "--context-length", str(context),
             "--kv-cache-dtype", KV_DTYPE_FLAG[rep.kv_cache_dtype], "--ess-hot-slots-per-request", str(slots),
             "--ess-share-host-pool", "on" if rep.chosen == "shared" else "off"] + mtp_flags(mtp)
    rows = batch + 1                                   # the store's request rows: SGLang's padding row added
    alloc = store_device_allocation(layers=rep.layers, row_bytes=rep.row_bytes, topk=m.topk_tokens,
                                    request_rows=rows, hot_slots=slots, context_tokens=context,
                                    lru_tables=lru_tables(m), draft_tokens=mtp if mtp > 1 else 0)
    return LaunchPlan(tuple(argv), rep.tokens_per_pool, pools.pools_per_node, pools.host_bytes_per_node, slots,
                      running, rows, tuple(alloc.items()))
