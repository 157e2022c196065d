"""The prefetch worker protocol: typed control messages over ZMQ, and the completion ledger.

Only indices and control cross the socket. Row data lives in StoreMemory (owned by the store,
mapped by both processes); the ledger below lives in one small memfd owned by the client.

Messages (orjson objects, key "t" names the type; index payloads are numpy via OPT_SERIALIZE_NUMPY):

  direction        type    fields
  worker -> client ready   v (PROTOCOL_VERSION), pid, inc (incarnation)
  client -> worker plan    id, kind, layer, mb, tier, deadline (monotonic s or null), tag, n, runs
  worker -> client done    inc, id, rows, busy_us, dropped
  worker -> client hb      inc                       (while busy, at most every heartbeat_s)
  worker -> client error   inc, id (-1: fatal, the worker exits), msg
  client -> worker stop    -

`runs` is a flat int64 list [src_start, dst_start, length] * R: entry j of a run is
(src_start + j, dst_start + j); a start of -1 means "-1 for the whole run" (skipped entries).
Consecutive sources going to consecutive destinations collapse into one run, so a contiguous
span of any length costs three numbers. Encoding is lossless up to negative indices, which all
become -1 (every engine treats any negative index as "skip").

CompletionLedger: int64 [cap] in shared memory. The worker writes 2*id (+1 if dropped) at
id % cap after a plan's rows (and ring tags) have landed and before it sends `done`; after a
worker dies, the client reads it to learn which unacknowledged plans finished, so a finished
plan is never executed twice (a re-run could read rows a later plan already overwrote). Exact
while the client keeps (newest id - oldest outstanding id) < cap.
"""
from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

import numpy as np
import orjson

from sgl_ess.prefetch.plan import KINDS, TIERS

PROTOCOL_VERSION = 1
_OPTS = orjson.OPT_SERIALIZE_NUMPY


class ProtocolError(ValueError):
    """A message that does not follow this protocol (the text says what came and what was expected)."""


# ---------------------------------------------------------------- runs (vectorised, no per-row loop)

def encode_runs(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """int64 [M] src, dst -> int64 [R, 3] runs (src_start, dst_start, length), order preserved."""
    src = np.where(np.asarray(src, dtype=np.int64) >= 0, src, -1).astype(np.int64, copy=False)
    dst = np.where(np.asarray(dst, dtype=np.int64) >= 0, dst, -1).astype(np.int64, copy=False)
    if src.shape != dst.shape or src.ndim != 1:
        raise ProtocolError(f"encode_runs: src and dst must be 1-D of one length, got {src.shape} and {dst.shape}")
    n = src.shape[0]
    if n == 0:
        return np.zeros((0, 3), dtype=np.int64)
    next_src = np.where(src[:-1] >= 0, src[:-1] + 1, -1)
    next_dst = np.where(dst[:-1] >= 0, dst[:-1] + 1, -1)
    brk = (src[1:] != next_src) | (dst[1:] != next_dst)
    starts = np.flatnonzero(np.concatenate(([True], brk)))
    lengths = np.diff(np.append(starts, n))
    return np.stack([src[starts], dst[starts], lengths], axis=1)


def decode_runs(runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 [R, 3] runs -> (src, dst) int64 [M]; inverse of encode_runs."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 3)
    s0, d0, length = runs[:, 0], runs[:, 1], runs[:, 2]
    if (length <= 0).any():
        raise ProtocolError(f"decode_runs: run lengths must be >= 1, got {length[length <= 0][:4].tolist()}")
    total = int(length.sum())
    first = np.cumsum(length) - length
    offset = np.arange(total, dtype=np.int64) - np.repeat(first, length)
    s, d = np.repeat(s0, length), np.repeat(d0, length)
    return np.where(s >= 0, s + offset, -1), np.where(d >= 0, d + offset, -1)


# ---------------------------------------------------------------- messages

@dataclass(frozen=True)
class Ready:
    version: int
    pid: int
    inc: int


@dataclass(frozen=True)
class PlanMsg:
    id: int
    kind: str
    layer: int
    mb: int
    tier: str
    deadline: float | None
    tag: int
    n: int
    runs: np.ndarray          # int64 [R, 3]

    def indices(self) -> tuple[np.ndarray, np.ndarray]:
        src, dst = decode_runs(self.runs)
        if src.shape[0] != self.n:
            raise ProtocolError(f"plan {self.id}: runs cover {src.shape[0]} entries; header says n={self.n}")
        return src, dst


@dataclass(frozen=True)
class Done:
    inc: int
    id: int
    rows: int
    busy_us: int
    dropped: bool


@dataclass(frozen=True)
class Heartbeat:
    inc: int


@dataclass(frozen=True)
class Error:
    inc: int
    id: int                   # -1: fatal, the worker exits after sending it
    msg: str


@dataclass(frozen=True)
class Stop:
    pass


_TYPES = {"ready": Ready, "plan": PlanMsg, "done": Done, "hb": Heartbeat, "error": Error, "stop": Stop}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def check_plan_indices(plan) -> None:
    """A worker needs CPU integer index tensors (they are encoded as runs)."""
    for name in ("src_idx", "dst_idx"):
        t = getattr(plan, name)
        if t.device.type != "cpu" or t.dtype.is_floating_point or t.dtype.is_complex:
            raise ValueError(f"prefetch worker: plan.{name} is {t.dtype} on {t.device}; expected int64 on the CPU "
                             f"(build CopyPlans on the CPU, or use --ess-prefetch-engine inline)")


def plan_message(plan) -> PlanMsg:
    """CopyPlan (CPU index tensors, plan_id assigned) -> PlanMsg."""
    check_plan_indices(plan)
    src, dst = plan.src_idx.numpy(), plan.dst_idx.numpy()
    return PlanMsg(id=plan.plan_id, kind=plan.kind, layer=int(plan.layer), mb=int(plan.micro_batch),
                   tier=plan.tier, deadline=plan.deadline_s, tag=int(plan.tag_seq), n=int(src.shape[0]),
                   runs=encode_runs(src, dst))


def encode(msg) -> bytes:
    d = {"t": _NAMES[type(msg)]}
    d.update(msg.__dict__)
    if isinstance(msg, PlanMsg):
        d["runs"] = np.ascontiguousarray(msg.runs, dtype=np.int64).reshape(-1)
    return orjson.dumps(d, option=_OPTS)


def decode(data: bytes):
    """bytes -> one of Ready, PlanMsg, Done, Heartbeat, Error, Stop; ProtocolError otherwise."""
    try:
        d = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise ProtocolError(f"received {len(data)} bytes that are not JSON ({e}); expected an orjson message") from e
    if not isinstance(d, dict) or d.get("t") not in _TYPES:
        got = d.get("t") if isinstance(d, dict) else type(d).__name__
        raise ProtocolError(f"received message type {got!r}; expected one of {', '.join(_TYPES)}")
    cls = _TYPES[d.pop("t")]
    if cls is PlanMsg and "runs" in d:
        d["runs"] = np.asarray(d["runs"], dtype=np.int64).reshape(-1, 3)
    try:
        msg = cls(**d)
    except TypeError as e:
        raise ProtocolError(f"{cls.__name__} message with fields {sorted(d)}: {e}") from e
    if cls is PlanMsg and (msg.kind not in KINDS or msg.tier not in TIERS):
        raise ProtocolError(f"plan {msg.id}: kind {msg.kind!r} / tier {msg.tier!r}; expected kind in {KINDS}, "
                            f"tier in {TIERS}")
    return msg


# ---------------------------------------------------------------- completion ledger

class CompletionLedger:
    """int64 [cap] in a memfd. The client creates it (fd=None) and owns the fd; the worker
    attaches the inherited fd. Entry id % cap holds 2*id + dropped once plan `id` finished."""

    def __init__(self, cap: int, fd: int | None = None):
        self.cap = int(cap)
        self.owner = fd is None
        if fd is None:
            fd = os.memfd_create("sgl_ess_ledger", os.MFD_CLOEXEC)
            os.ftruncate(fd, self.cap * 8)
        self.fd = fd
        self._map = mmap.mmap(fd, self.cap * 8, flags=mmap.MAP_SHARED)
        self._arr = np.frombuffer(self._map, dtype=np.int64)
        if self.owner:
            self._arr[:] = -1

    def mark(self, plan_id: int, dropped: bool) -> None:
        self._arr[plan_id % self.cap] = 2 * plan_id + int(dropped)

    def status(self, plan_id: int) -> str | None:
        """'done', 'dropped', or None (not finished, or overwritten: keep the span below cap)."""
        v = int(self._arr[plan_id % self.cap])
        if v == 2 * plan_id:
            return "done"
        if v == 2 * plan_id + 1:
            return "dropped"
        return None

    def close(self) -> None:
        """Unmap; the owner also closes the fd (the kernel frees the memory with the last holder)."""
        if self._map is None:
            return
        self._arr = None
        self._map.close()
        self._map = None
        if self.owner:
            os.close(self.fd)
