"""Checks the launcher runs BEFORE the model loads (seconds, not minutes), each refusing with one
line that names the flag: host-pool sizing, hot-slot feasibility, and the HTTP port.

Why here: SGLang sizes pools and builds the ESS store only after loading the model, so a hot
buffer that cannot hold index_topk + 1 rows, or a port already taken by another server, used to
be found a minute later (with a traceback, or after warm-up requests were sent to the OTHER
server). Pure Python: the model's geometry comes from its config.json.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from dataclasses import dataclass
from typing import Optional

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


def model_geometry(model_path: str) -> Optional[ModelGeometry]:
    """From a local config.json; None when the model is not a local directory."""
    try:
        with open(os.path.join(model_path, "config.json")) as fh:
            c = json.load(fh)
        return ModelGeometry(layers=int(c["num_hidden_layers"]),
                             latent_row_bytes=(int(c["kv_lora_rank"]) + int(c["qk_rope_head_dim"])) * 2,
                             index_topk=c.get("index_topk"), vocab_size=c.get("vocab_size"))
    except (OSError, KeyError, ValueError, TypeError):
        return None


def pool_tokens_from_gb(gb: float, geo: ModelGeometry, page_size: int) -> int:
    """--max-total-tokens for a host pool of `gb` GB. SGLang adds one padding page to its pool,
    so the tokens are rounded down to whole pages and one page is left for it: the host rows
    actually allocated, (tokens + page) x layers x row_bytes, stay within the budget."""
    rows = int(gb * 1e9) // (geo.layers * geo.latent_row_bytes)
    return (rows // page_size) * page_size - page_size


def resolve_pool_tokens(ess_on: bool, memory_pool_size_gb: float, max_total_tokens: Optional[int],
                        geo: Optional[ModelGeometry], page_size: int, default_tokens: int) -> tuple[int, str]:
    """(tokens for --max-total-tokens, where the number came from). Raises PreflightError when the
    ESS host-pool budget and --max-total-tokens both size the pool and disagree."""
    if not ess_on or not memory_pool_size_gb:
        if max_total_tokens is not None:
            return max_total_tokens, "--max-total-tokens"
        return default_tokens, "launcher default"
    if geo is None:
        raise PreflightError(
            f"--ess-memory-pool-size-gb {memory_pool_size_gb:g}: the model has no local config.json to turn GB into "
            f"tokens; give the host pool in tokens with --max-total-tokens instead")
    tokens = pool_tokens_from_gb(memory_pool_size_gb, geo, page_size)
    if tokens < page_size:
        raise PreflightError(
            f"--ess-memory-pool-size-gb {memory_pool_size_gb:g} holds {tokens} tokens ({geo.layers} layers x "
            f"{geo.latent_row_bytes} B per token, {page_size}-token pages); expected at least one page. Raise it")
    if max_total_tokens is not None and max_total_tokens != tokens:
        raise PreflightError(
            f"--ess-memory-pool-size-gb {memory_pool_size_gb:g} sizes the host pool at {tokens} tokens, but "
            f"--max-total-tokens {max_total_tokens} was also given (with ESS on, SGLang's token pool IS the host pool); "
            f"give only one of them")
    return tokens, f"--ess-memory-pool-size-gb {memory_pool_size_gb:g}"


def hot_slots_per_request(hot_slots: int, max_gpu_buffer_size_gb: float, geo: ModelGeometry,
                          max_running_requests: int) -> tuple[int, str]:
    """The hot-buffer slots each request gets per layer, as the store will derive them
    (SGLang keeps one request row more than --max-running-requests: row 0 is padding)."""
    if hot_slots:
        return hot_slots, f"--ess-hot-slots-per-request {hot_slots}"
    if max_gpu_buffer_size_gb:
        rows = max_running_requests + 1
        n = int(max_gpu_buffer_size_gb * 1e9) // (geo.layers * geo.latent_row_bytes * rows)
        return n, (f"--ess-max-gpu-buffer-size-gb {max_gpu_buffer_size_gb:g} / ({rows} request rows x "
                   f"{geo.layers} layers x {geo.latent_row_bytes} B)")
    return 4 * (geo.index_topk or 0), "4 x index_topk"


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
