"""Checks the launcher runs BEFORE the model loads (seconds, not minutes), each refusing with one
line that names the flag: host-pool sizing, hot-slot feasibility, the memory --ess-lock-host-memory
would lock against RLIMIT_MEMLOCK, and the HTTP port.

Why here: SGLang sizes pools and builds the ESS store only after loading the model, so a hot
buffer that cannot hold index_topk + 1 rows, or a port already taken by another server, used to
be found a minute later (with a traceback, or after warm-up requests were sent to the OTHER
server). Pure Python: the launcher reads the model's geometry (launcher/model_config.py) and passes it in.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import socket
from dataclasses import dataclass
from typing import Optional

from sgl_ess.core.hot_slots import hot_slots_rule

DSA_PAGE_SIZE = 64  # SGLang's DSA pools use 64-token pages


class PreflightError(ValueError):
    """A configuration that cannot work; the message names the flags that fix it."""


class PortInUse(PreflightError):
    pass


@dataclass(frozen=True)
class ModelGeometry:
    layers: int
    latent_row_bytes: int       # (kv_lora_rank + qk_rope_head_dim) x 2 (bf16 cache, the ESS-on path)
    index_topk: Optional[int]   # None: not a DSA model
    vocab_size: Optional[int]
    kv_lora_rank: Optional[int] = None      # the latent's parts, for the FP8 row (launcher/pool_plan.fp8_geometry)
    qk_rope_head_dim: Optional[int] = None
    context_len: Optional[int] = None       # SGLang's context length of the config (get_context_length)


def model_geometry(model_path: str) -> Optional[ModelGeometry]:
    """From a local config.json; None when the model is not a local directory."""
    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            c = json.load(fh)
        r, p = int(c["kv_lora_rank"]), int(c["qk_rope_head_dim"])
        return ModelGeometry(layers=int(c["num_hidden_layers"]), latent_row_bytes=(r + p) * 2,
                             index_topk=c.get("index_topk"), vocab_size=c.get("vocab_size"), kv_lora_rank=r,
                             qk_rope_head_dim=p)
    except (OSError, KeyError, ValueError, TypeError):
        return None


def pool_tokens_from_gb(gb: float, geo: ModelGeometry, page_size: int) -> int:
    """--max-total-tokens for a host pool of `gb` GB. SGLang adds one padding page to its pool,
    so the tokens are rounded down to whole pages and one page is left for it: the host rows
    actually allocated, (tokens + page) x layers x row_bytes, stay within the budget."""
    rows = int(gb * 1e9) // (geo.layers * geo.latent_row_bytes)
    return (rows // page_size) * page_size - page_size


def resolve_pool_tokens(ess_on: bool, memory_pool_size_gb: float, max_total_tokens: Optional[int],
                        geo: Optional[ModelGeometry], page_size: int, default_tokens: int, pools: int = 1,
                        budget_source: Optional[str] = None) -> tuple[int, str]:
    """(tokens for --max-total-tokens, where the number came from). `memory_pool_size_gb` is the host
    budget of one node, split evenly over the node's `pools` host pools (one per rank, or one per
    attention-TP group when its ranks share it); `budget_source` names a budget the launcher chose
    (its default) rather than the user. Raises PreflightError when the budget and --max-total-tokens
    both size the pool and disagree."""
    if not ess_on or not memory_pool_size_gb:
        if max_total_tokens is not None:
            return max_total_tokens, "--max-total-tokens"
        return default_tokens, "launcher default"
    what = budget_source or f"--ess-memory-pool-size-gb {memory_pool_size_gb:g}" + (
        f" per node / {pools} host pools on the node" if pools > 1 else "")
    if geo is None:
        raise PreflightError(
            f"{what}: the model has no readable config to turn GB into tokens; give the host pool in tokens "
            f"with --max-total-tokens instead")
    tokens = pool_tokens_from_gb(memory_pool_size_gb / pools, geo, page_size)
    if tokens < page_size:
        raise PreflightError(
            f"{what} holds {tokens} tokens per pool ({geo.layers} layers x {geo.latent_row_bytes} B per token, "
            f"{page_size}-token pages); expected at least one page. Raise --ess-memory-pool-size-gb")
    if max_total_tokens is not None and max_total_tokens != tokens:
        raise PreflightError(
            f"{what} sizes the host pool at {tokens} tokens, but --max-total-tokens {max_total_tokens} was also "
            f"given (with ESS on, SGLang's token pool IS the host pool); give only one of them")
    return tokens, what


def hot_slots_per_request(hot_slots: int, max_gpu_buffer_size_gb: float, geo: ModelGeometry,
                          max_running_requests: int) -> tuple[int, str]:
    """The hot-buffer slots each request gets per layer, by the store's own rule (core/hot_slots.py;
    SGLang keeps one request row more than --max-running-requests: row 0 is padding)."""
    return hot_slots_rule(hot_slots, max_gpu_buffer_size_gb, geo.layers, geo.latent_row_bytes, geo.index_topk or 0,
                          max_running_requests + 1)


def check_hot_slots(hot_slots: int, max_gpu_buffer_size_gb: float, geo: Optional[ModelGeometry],
                    max_running_requests: int) -> Optional[int]:
    """Raise PreflightError when the hot buffer cannot hold one step's top-k plus the newest row."""
    if geo is None or not geo.index_topk:
        return None
    n, source = hot_slots_per_request(hot_slots, max_gpu_buffer_size_gb, geo, max_running_requests)
    if n < geo.index_topk + 1:
        raise PreflightError(
            f"{source} gives {n} hot slots per request per layer; the model's index_topk={geo.index_topk} needs "
            f">= {geo.index_topk + 1} (top-k plus the newest token). Raise --ess-hot-slots-per-request"
            + (" / --ess-max-gpu-buffer-size-gb or lower --max-running-requests" if not hot_slots else ""))
    return n


def check_port(host: str, port: int) -> None:
    """Raise PortInUse if `host:port` cannot be bound the way uvicorn binds it (SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUse(f"--port {port}: {host}:{port} is already in use (another server?); "
                                f"stop it or pick another --port")
            raise PreflightError(f"--host {host} --port {port}: cannot bind ({e.strerror}); check --host")


# --- --ess-lock-host-memory ---------------------------------------------------------------------
MEMLOCK_FIX = ("Raise the limit (`ulimit -l unlimited` in the shell that starts the server; systemd "
               "LimitMEMLOCK=infinity; docker run --ulimit memlock=-1:-1) or drop --ess-lock-host-memory")
CAP_IPC_LOCK = 14          # capability bit: mlock without RLIMIT_MEMLOCK
_PAGE_BYTES = 4096         # mlock locks whole pages
# slot_space_bytes mirrors SlotSpace's layout without importing the store (torch): a unit test
# (tests/unit/serving/test_memlock_preflight.py) holds the two equal
_SLOT_PAGE_ROWS = 64       # sgl_ess/store/slot_space.py PAGE_ROWS
_RING_GROUPS = 8           # StoreConfig.ring_groups: 2 layer parities x 4 micro-batches (the default)


def memlock_limit_bytes() -> Optional[int]:
    """The soft RLIMIT_MEMLOCK of this process (what mlock checks) in bytes; None = unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def has_cap_ipc_lock(status_path: str = "/proc/self/status") -> bool:
    """True when this process may mlock past RLIMIT_MEMLOCK (CAP_IPC_LOCK in CapEff; root usually has it)."""
    try:
        with open(status_path) as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _pages(nbytes: int) -> int:
    return -(-nbytes // _PAGE_BYTES) * _PAGE_BYTES


def slot_space_bytes(layers: int, row_bytes: int, request_rows: int, hot_slots: int, topk: int,
                     ring_slots: int = 0, spec_slots: int = 0) -> int:
    """Bytes of the CPU slot space segment (hot buffers + 8 staging-ring groups + speculative rows,
    padded to 64-row pages, + int64 ring tags), as sgl_ess.store.slot_space.SlotSpace lays it out;
    `ring_slots` / `spec_slots` 0 = the store's default (request_rows x topk / 8, at least topk)."""
    ring = ring_slots or max(topk, request_rows * topk // 8)
    staged = _RING_GROUPS * ring + 2 * spec_slots
    used = layers * request_rows * hot_slots + staged
    total = -(-used // _SLOT_PAGE_ROWS) * _SLOT_PAGE_ROWS
    return total * row_bytes + 8 * max(1, staged)


def locked_bytes(host_bytes: int, slot_bytes: int = 0) -> int:
    """What --ess-lock-host-memory locks in each process that maps the segments (whole pages)."""
    return _pages(host_bytes) + (_pages(slot_bytes) if slot_bytes else 0)


def check_memlock(want_bytes: int, what: str, limit_bytes: Optional[int] = -1,
                  cap_ipc_lock: Optional[bool] = None) -> None:
    """Raise PreflightError when `want_bytes` cannot be mlocked by one process. `limit_bytes` -1 (default) =
    this process's RLIMIT_MEMLOCK, None = unlimited; `cap_ipc_lock` None = read this process's."""
    limit = memlock_limit_bytes() if limit_bytes == -1 else limit_bytes
    cap = has_cap_ipc_lock() if cap_ipc_lock is None else cap_ipc_lock
    if cap or limit is None or want_bytes <= limit:
        return
    raise PreflightError(
        f"--ess-lock-host-memory: each process that maps the latent cache (the scheduler, and its prefetch worker "
        f"if any) locks {want_bytes} bytes ({want_bytes / 1e6:.1f} MB: {what}), but RLIMIT_MEMLOCK is {limit} "
        f"bytes ({limit / 1e6:.1f} MB) per process and the launcher has no CAP_IPC_LOCK. {MEMLOCK_FIX}")
