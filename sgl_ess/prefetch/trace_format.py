"""The top-k trace format (``sgl_ess.topk_trace/1``): what a store's LRU and predictors saw, in order.

One JSON object per line. The first line is the header::

    {"format": "sgl_ess.topk_trace/1", "source": "synthetic" | "server" | "store",
     "num_layers": L, "topk": k, "max_context_tokens": T, "hot_slots_per_request": N, "note": "...", ...}

then one event per line, in the order the store saw them:

  {"ev": "open",   "req": r}                                  a request index got a new request
  {"ev": "close",  "req": r}                                  it finished (state of r is dropped)
  {"ev": "warmup", "layer": l, "reqs": [b], "seq_lens": [b], "ids": [b][W][k]}   LRU warmup (prefill)
  {"ev": "touch",  "layer": l, "reqs": [b], "seq_lens": [b], "pos": [b][m]}       LRU accesses a
                                                              predictor does not see (newest tokens
                                                              reserved before the plan, accepted drafts)
  {"ev": "plan",   "layer": l, "mb": micro_batch, "reqs": [b], "seq_lens": [b], "topk": [b][k]}
                                                              one plan: the layer's top-k token
                                                              positions per request, -1 padded

Token positions are positions in the request (not host locations). ``source`` says where the trace
came from; a synthetic trace also carries the generator's configuration (``synthetic``) and says so in
``note``. Reading returns numpy arrays; this module imports no torch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

FORMAT = "sgl_ess.topk_trace/1"
EVENTS = ("open", "close", "warmup", "touch", "plan")
_ARRAYS = {"reqs": np.int64, "seq_lens": np.int64, "ids": np.int64, "pos": np.int64, "topk": np.int64}


class TraceFormatError(ValueError):
    """A trace file that is not sgl_ess.topk_trace/1; the message names the file and the line."""


@dataclass
class Trace:
    header: dict
    events: list[dict] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return int(self.header["num_layers"])

    @property
    def topk(self) -> int:
        return int(self.header["topk"])

    def plans(self):
        return (e for e in self.events if e["ev"] == "plan")


def make_header(source: str, num_layers: int, topk: int, max_context_tokens: int, hot_slots_per_request: int,
                note: str = "", **extra) -> dict:
    return {"format": FORMAT, "source": source, "num_layers": int(num_layers), "topk": int(topk),
            "max_context_tokens": int(max_context_tokens), "hot_slots_per_request": int(hot_slots_per_request),
            "note": note, **extra}


def encode(obj: dict) -> str:
    """One line of the trace (numpy arrays and scalars become JSON lists and numbers)."""
    return json.dumps({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in obj.items()},
                      separators=(",", ":")) + "\n"


def write_trace(path: str, trace: Trace) -> None:
    with open(path, "w") as fh:
        fh.write(encode(trace.header))
        for ev in trace.events:
            fh.write(encode(ev))


def _decode_event(d: dict, where: str) -> dict:
    kind = d.get("ev")
    if kind not in EVENTS:
        raise TraceFormatError(f"{where}: event {kind!r}; expected one of {', '.join(EVENTS)}")
    for key, dt in _ARRAYS.items():
        if key in d:
            d[key] = np.asarray(d[key], dtype=dt)
    if kind in ("plan", "touch", "warmup"):
        data = d["topk"] if kind == "plan" else d["pos"] if kind == "touch" else d["ids"]
        if data.ndim != (3 if kind == "warmup" else 2) or data.shape[0] != d["reqs"].size:
            raise TraceFormatError(f"{where}: {kind} of {d['reqs'].size} requests carries an array of shape "
                                   f"{list(data.shape)}")
    return d


def read_trace(path: str) -> Trace:
    """Read a whole trace. Raises TraceFormatError naming the file and line on anything unexpected."""
    try:
        fh = open(path)
    except FileNotFoundError:
        raise TraceFormatError(f"trace {path!r} does not exist (record one with `python -m bench trace --out "
                               f"FILE`, or generate one with `python -m bench trace --synthetic --out FILE`)")
    with fh:
        first = fh.readline()
        try:
            header = json.loads(first)
        except json.JSONDecodeError:
            raise TraceFormatError(f"{path}:1: not JSON; expected a {FORMAT} header line")
        if not isinstance(header, dict) or header.get("format") != FORMAT:
            got = header.get("format") if isinstance(header, dict) else type(header).__name__
            raise TraceFormatError(f"{path}:1: format {got!r}; expected {FORMAT!r}")
        trace = Trace(header)
        for i, line in enumerate(fh, start=2):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                raise TraceFormatError(f"{path}:{i}: not JSON (a truncated last line: the recording store "
                                       "was not shut down)")
            trace.events.append(_decode_event(d, f"{path}:{i}"))
    return trace
