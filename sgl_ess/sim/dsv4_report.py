"""`python -m sgl_ess.sim v4`: the DeepSeek-V4 capacity table (dsv4.py), one row per context, or JSON."""
from __future__ import annotations

import argparse
import json

from .config import SimConfigError
from .dsv4 import V4Spec, capacity, host_bytes_per_token
from .hardware import get_hardware

PARTS = ("window", "c128_entries", "c4_index_keys", "compressor_state", "c4_entries", "c4_hot_buffer")


def _contexts(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        t = part.strip()
        try:
            out.append(int(float(t[:-1]) * 1024) if t[-1:] in ("k", "K") else int(t))
        except ValueError:
            raise SimConfigError(f"--context {part!r}: expected tokens as an integer or Nk (32k = 32768)") from None
    return out


def cmd_v4(args: argparse.Namespace) -> int:
    m = V4Spec.load(args.model)
    hw = get_hardware(args.hardware)
    mem = args.gpu_mem_gb * 1e9 if args.gpu_mem_gb else hw.memory_bytes
    if args.ep < 1 or args.gpus_per_node < 1:
        raise SimConfigError(f"--ep {args.ep} / --gpus-per-node {args.gpus_per_node}: expected positive integers")
    caps = [capacity(m, c, mem, args.ep, args.ratio, args.host_mem_gb, args.gpus_per_node)
            for c in _contexts(args.context)]
    if args.json:
        for c in caps:
            print(json.dumps({"model": m.name, "context": c.context, "ratio": c.ratio, "ep": c.ep,
                              "weights_gb": c.weights_bytes / 1e9, "reserve_gb": c.reserve_bytes / 1e9,
                              "resident_bytes": c.resident, "ess_bytes": c.ess,
                              "host_bytes_per_request": c.host_bytes_per_request,
                              "batch_resident": c.batch_resident, "batch_ess_gpu": c.batch_ess_gpu,
                              "batch_ess_host": c.batch_ess_host, "batch_ess": c.batch_ess, "gain": c.gain}))
        return 0
    c0 = caps[0]
    print(f"{m.name}: {len(m.ratios)} layers = {m.c4_layers} C4 + {m.c128_layers} C128 + "
          f"{len(m.ratios) - m.c4_layers - m.c128_layers} window only; {hw.name} {mem / 1e9:.0f} GB, weights "
          f"{c0.weights_bytes / 1e9:.1f} GB (EP {c0.ep}) + reserve {c0.reserve_bytes / 1e9:.1f} GB; ESS host bytes "
          f"per token {host_bytes_per_token(m):.0f}")
    head = f"{'context':>8} {'way':>8} " + " ".join(f"{p:>16}" for p in PARTS) + f" {'MB/req':>8} {'batch':>6}"
    print("GPU MB per request by part, and the largest batch per GPU:")
    print(head)
    for c in caps:
        for way, parts, batch in (("resident", c.resident, c.batch_resident), ("ess", c.ess, c.batch_ess)):
            cells = " ".join(f"{parts[p] / 1e6:>16.2f}" if p in parts else f"{'-':>16}" for p in PARTS)
            print(f"{c.context:>8} {way:>8} {cells} {sum(parts.values()) / 1e6:>8.2f} {batch:>6}")
        host = f"; host-limited to {c.batch_ess_host}" if c.batch_ess_host is not None else ""
        gain = f"{c.gain:.2f}x" if c.gain is not None else "n/a"
        print(f"{'':>8} ESS batch / resident batch = {gain}; host {c.host_bytes_per_request / 1e9:.3f} GB per "
              f"request, {c.host_bytes_per_request * c.batch_ess * args.gpus_per_node / 1e9:.0f} GB per node{host}")
    print("ESS for V4 is served on CPU (C4 entries as SGLang's 584-byte rows, keyed by C4 location: docs/dsv4.md); "
          "on a GPU node it is planned, not served; the ESS store's rings and LRU tables are not counted; "
          "window: two 256-token SWA pages per layer (worst case)")
    return 0
