"""Shared-memory StoreMemory and random CopyPlans for the prefetch tests (no mocks: real memfds)."""
from __future__ import annotations

import gc
import glob
import os
import pathlib
import tempfile
import time

import numpy as np
import torch

from sgl_ess.prefetch.engine import InlineEngine
from sgl_ess.prefetch.memory import StoreMemory
from sgl_ess.prefetch.plan import KINDS, TIERS, CopyPlan
from sgl_ess.memory.shared_segment import SharedSegment

L, T, B = 3, 4096, 32          # layers, host rows per layer, bytes per row
S, RING_BASE = 2048, 1024      # slot rows; rows >= RING_BASE are staging-ring slots (tagged)


def make_memory(seed: int) -> StoreMemory:
    """Host pool and slot space (+ ring tags) in memfds, as the store lays them out, random bytes."""
    hseg = SharedSegment(L * T * B, label="sgl_ess_host")
    sseg = SharedSegment(S * B + (S - RING_BASE) * 8, label="sgl_ess_slots")
    mem = StoreMemory(host=hseg.tensor(torch.uint8, (L, T, B)), slots=sseg.tensor(torch.uint8, (S, B)),
                      ring_tags=sseg.tensor(torch.int64, (S - RING_BASE,), offset_bytes=S * B),
                      ring_base=RING_BASE, host_segment=hseg, slot_segment=sseg)
    g = torch.Generator().manual_seed(seed)
    mem.host.copy_(torch.randint(0, 256, (L, T, B), dtype=torch.uint8, generator=g))
    mem.slots.copy_(torch.randint(0, 256, (S, B), dtype=torch.uint8, generator=g))
    mem.ring_tags.fill_(-1)
    return mem


def copy_memory(mem: StoreMemory) -> StoreMemory:
    other = make_memory(0)
    other.host.copy_(mem.host)
    other.slots.copy_(mem.slots)
    other.ring_tags.copy_(mem.ring_tags)
    return other


def same_bytes(a: StoreMemory, b: StoreMemory) -> bool:
    return (torch.equal(a.host, b.host) and torch.equal(a.slots, b.slots)
            and torch.equal(a.ring_tags, b.ring_tags))


def _indices(rng: np.random.Generator, lo: int, hi: int, m: int, style: str) -> np.ndarray:
    """m distinct-ish indices in [lo, hi): one long run, scattered, or short runs."""
    if style == "run":
        start = int(rng.integers(lo, hi - m + 1))
        return np.arange(start, start + m, dtype=np.int64)
    if style == "scattered":
        return rng.choice(np.arange(lo, hi), size=m, replace=False).astype(np.int64)
    parts, left = [], m                  # short runs (lengths 1..4) at random places
    while left:
        n = min(left, int(rng.integers(1, 5)))
        s = int(rng.integers(lo, hi - n + 1))
        parts.append(np.arange(s, s + n))
        left -= n
    return np.concatenate(parts).astype(np.int64)


def random_plan(rng: np.random.Generator, tier: str, *, parts: int = 1, part: int = 0,
                max_rows: int = 200, kind: str | None = None, tag_seq: int | None = None) -> CopyPlan:
    """A plan of a random kind touching only region `part` of `parts` (host rows, hot slots and
    ring slots are split evenly), so plans of different regions never conflict. Destinations are
    distinct and never among the plan's sources (no plan reads what it writes)."""
    kind = kind or str(rng.choice(KINDS))
    hw, sw, rw = T // parts, RING_BASE // parts, (S - RING_BASE) // parts
    host = (part * hw, (part + 1) * hw)
    hot = (part * sw, (part + 1) * sw)
    ring = (RING_BASE + part * rw, RING_BASE + (part + 1) * rw)
    m = int(rng.integers(1, max_rows + 1))
    style = str(rng.choice(["run", "scattered", "short"]))
    if kind == "h2s":
        src_r, dst_r = host, (ring if rng.random() < 0.6 else hot)
    elif kind == "s2h":
        src_r, dst_r = (ring if rng.random() < 0.5 else hot), host
    elif kind in ("s2s", "move"):
        src_r, dst_r = ring, hot                         # commit: ring rows -> their LRU slots
    else:
        src_r, dst_r = host, host
    m = min(m, src_r[1] - src_r[0], dst_r[1] - dst_r[0])
    src = _indices(rng, *src_r, m, style)
    dst = _indices(rng, *dst_r, m, style if style != "short" else "scattered")
    dst = np.unique(dst) if style == "short" else dst
    src = src[: dst.shape[0]]
    if kind == "zero":
        src = np.full_like(dst, -1)
    holes = rng.random(dst.shape[0]) < 0.1               # -1 entries on either side
    side = rng.random(dst.shape[0]) < 0.5
    src = np.where(holes & side, -1, src)
    dst = np.where(holes & ~side, -1, dst)
    return CopyPlan(kind, torch.from_numpy(src), torch.from_numpy(dst), layer=int(rng.integers(0, L)), tier=tier,
                    micro_batch=int(rng.integers(0, 2)),
                    tag_seq=int(rng.integers(0, 1 << 40)) if tag_seq is None else tag_seq)


def clone_plan(p: CopyPlan) -> CopyPlan:
    return CopyPlan(p.kind, p.src_idx.clone(), p.dst_idx.clone(), layer=p.layer, tier=p.tier,
                    micro_batch=p.micro_batch, tag_seq=p.tag_seq, deadline_s=p.deadline_s)


def run_inline(mem: StoreMemory, plans: list[CopyPlan]) -> None:
    eng = InlineEngine(mem)
    for p in plans:
        eng.submit(clone_plan(p))


def wait_until(pred, timeout_s: float = 30.0, what: str = "condition") -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def our_dirs() -> set[str]:
    """Private ipc directories of prefetch workers (they exist only while a worker starts)."""
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "sgless-prefetch-*")))


def open_fds() -> set[tuple[str, str]]:
    """This process's open fds as (number, target). Garbage from earlier tests is collected first, so an fd that an
    unrelated dropped object closes later cannot look like a change; callers check that nothing NEW is open."""
    gc.collect()
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            out.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:                   # the listdir fd itself, closed by now
            pass
    return out


ALL_TIERS = TIERS
