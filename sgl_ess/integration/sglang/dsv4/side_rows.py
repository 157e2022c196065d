"""The CPU dsv4 arm's rows, float32, addressed by SGLang's full-pool token location (out_cache_loc /
req_to_token), one table per (layer, kind): the window row of every token ("swa", the value the pool's
584-byte FP8 window row holds: the arm rounds it so), and each compressed layer's per-token compressor
projection wkv_gate(x) ("core", and "index" for the C4 indexer's own compressor). Compressed entries are pooled
from the projections when read (compressed_entries.py), so no compressor ring is kept. Grows on demand.
"""

from __future__ import annotations

import torch


class SideRows:
    def __init__(self):
        self._tables: dict[tuple[int, str], torch.Tensor] = {}

    def write(self, layer_id: int, kind: str, loc: torch.Tensor, rows: torch.Tensor) -> None:
        if loc.numel() == 0:
            return
        key, need = (layer_id, kind), int(loc.max()) + 1
        table = self._tables.get(key)
        if table is None or table.shape[0] < need or table.shape[1] != rows.shape[-1]:
            grown = torch.zeros(max(need, 2 * (0 if table is None else table.shape[0])), rows.shape[-1])
            if table is not None and table.shape[1] == rows.shape[-1]:
                grown[: table.shape[0]] = table
            self._tables[key] = table = grown
        table[loc.long()] = rows.float().reshape(loc.numel(), -1)

    def read(self, layer_id: int, kind: str, loc: torch.Tensor) -> torch.Tensor:
        table = self._tables.get((layer_id, kind))
        if table is None or (loc.numel() and int(loc.max()) >= table.shape[0]):
            raise RuntimeError(f"dsv4 CPU arm: layer {layer_id} has no '{kind}' row for a location it reads "
                               "(a token whose row was never written)")
        return table[loc.long()]

    def table(self, layer_id: int, kind: str) -> torch.Tensor | None:
        """The (layer, kind) table float32 [n, d] as stored (rows never written are 0), or None."""
        return self._tables.get((layer_id, kind))
