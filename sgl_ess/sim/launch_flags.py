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

from dataclasses import dataclass

from .config import ModelSpec
from .host_pools import HostPoolReport
from .store_device import hot_slots, model_store_allocation

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
    alloc = model_store_allocation(m, batch, ratio, context, mtp, row_bytes=rep.row_bytes)
    return LaunchPlan(tuple(argv), rep.tokens_per_pool, pools.pools_per_node, pools.host_bytes_per_node, slots,
                      running, batch + 1, tuple(alloc.items()))
