"""TraceRecorder: an opt-in record of what a LatentStore saw (--ess-trace-file), for offline study.

Writes sgl_ess.topk_trace/1 (sgl_ess/prefetch/trace_format.py): a header with the store's sizes,
then one line per open / close / warmup / touch (reserve, admit_from_host) / plan, in call order.
It is for measurement, not for serving: each event copies its indices to the host (a device sync per
layer on CUDA) and the file grows by about b x k x 6 bytes per layer per step.

Path: `{pid}` in it becomes the process id (several scheduler ranks need several files). The file is
created exclusively: an existing file is refused, not overwritten or interleaved. A second store in
the same process (the EAGLE draft runner's) writes PATH.store1, and so on.
Every event is written and flushed when it is recorded, so a server stopped by a signal leaves a
complete file (SGLang's exit path does not shut stores down). Memory: none beyond one line.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from sgl_ess.prefetch.trace_format import encode, make_header

_open_paths: dict[str, int] = {}
_lock = threading.Lock()


def _np(x) -> np.ndarray:
    return x.detach().to("cpu").numpy() if hasattr(x, "detach") else np.asarray(x)


class TraceRecorder:
    def __init__(self, path: str, cfg, source: str = "store", **meta):
        path = path.replace("{pid}", str(os.getpid()))
        with _lock:
            n = _open_paths.get(path, 0)
            _open_paths[path] = n + 1
        self._base = path
        self.path = path if n == 0 else f"{path}.store{n}"
        try:
            self._fh = open(self.path, "x")
        except FileExistsError:
            self._release()
            raise FileExistsError(f"--ess-trace-file: {self.path!r} exists; remove it or choose another path "
                                  "(put {pid} in it when several processes record)") from None
        self.events = 0
        self._write(make_header(source, cfg.num_layers, cfg.topk, cfg.max_context_tokens, cfg.hot_slots_per_request,
                                "recorded by sgl_ess.store.trace_recorder", row_bytes=cfg.row_bytes, **meta))

    def _write(self, obj: dict) -> None:
        if self._fh is None:
            return
        self._fh.write(encode(obj))
        self._fh.flush()
        self.events += 1

    def open(self, req: int) -> None:
        self._write({"ev": "open", "req": int(req)})

    def close_request(self, req: int) -> None:
        self._write({"ev": "close", "req": int(req)})

    def warmup(self, layer: int, reqs, seq_lens, ids) -> None:
        self._write({"ev": "warmup", "layer": int(layer), "reqs": _np(reqs), "seq_lens": _np(seq_lens), "ids": _np(ids)})

    def touch(self, layer: int, reqs, seq_lens, positions) -> None:
        self._write({"ev": "touch", "layer": int(layer), "reqs": _np(reqs), "seq_lens": _np(seq_lens),
                     "pos": _np(positions)})

    def plan(self, layer: int, micro_batch: int, reqs, seq_lens, topk) -> None:
        self._write({"ev": "plan", "layer": int(layer), "mb": int(micro_batch), "reqs": _np(reqs),
                     "seq_lens": _np(seq_lens), "topk": _np(topk)})

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._release()

    def _release(self) -> None:
        with _lock:
            _open_paths[self._base] -= 1
