"""Host-side bookkeeping of decode CUDA graphs (--ess-cuda-graph; backends/cuda_graph.py): what a
replayed graph does that no Python of ours sees, counted before each replay.

A capture runs our Python once (SGLang's two eager warm-ups before it run it too, on padding rows
only). The host counters it moved (plans early / late, plans per engine tier) describe one step of
that captured size, and no device ran them at capture: `close` takes them back out and keeps them
per captured size, and every replay of that size adds them again. The capture's Python ends
unannounced (SGLang calls no hook after it), so it is closed at the next hook: the next size's
capture, a replay, or an eager forward. While a capture may be running (`capturing`), readers of
device values from other threads (the metrics thread's `usage()`) must not touch the device: a
read during a global-mode capture invalidates it.
"""

from __future__ import annotations


class GraphSteps:
    def __init__(self):
        self.captures = self.replays = 0
        self.rows = 0                        # real request rows over all replays
        self.capturing = False
        self._size: int | None = None        # the size SGLang is capturing now
        self._open = None                    # (size, counts before the capture's run)
        self._per_size: dict[int, dict] = {}  # size -> what one replay of it counts
        self._width = 1                      # query tokens per request of the step being captured
        self._widths: dict[int, int] = {}    # size -> query tokens per request (MTP verify: draft tokens)

    def begin_capture(self, size: int) -> None:
        """SGLang starts the warm-ups and capture of one size."""
        self.captures += 1
        self._size = size
        self._width = 1
        self.capturing = True

    def note_width(self, n: int) -> None:
        """The step being captured has `n` query tokens per request (an MTP verify: its draft tokens),
        each writing one latent row: a replay of it writes n rows per real request."""
        self._width = int(n)

    def before_capture(self, counts: dict) -> None:
        """After a warm-up (SGLang runs two): the capture's run may come next; `counts` now."""
        self._open = (self._size, counts)

    def close(self, counts: dict) -> dict | None:
        """The capture's run is over (`counts` now): return the counts to put back (what they were
        before it) and keep its deltas for its size; None if no capture was open."""
        self.capturing = False
        if self._open is None:
            return None
        size, before = self._open
        self._open = None
        self._per_size[size] = _minus(counts, before)
        self._widths[size] = self._width
        return before

    def width(self, size: int) -> int:
        """Query tokens per request of the graph captured at `size` (1: a decode step)."""
        return self._widths.get(size, 1)

    def replay(self, size: int, n_real: int) -> dict:
        """One replay of `size` rows, `n_real` of them real: the counts to add."""
        self.replays += 1
        self.rows += n_real
        return self._per_size.get(size, {})

    def usage(self) -> dict:
        if not self.captures:
            return {}
        return {"graph_captures": self.captures, "graph_replays": self.replays, "graph_rows": self.rows}


def _minus(a: dict, b: dict) -> dict:
    return {k: _minus(v, b[k]) if isinstance(v, dict) else v - b[k] for k, v in a.items()}


def plus(a: dict, b: dict) -> dict:
    """`a` with `b`'s counts added (`b` may be {}: a size never captured)."""
    return {k: plus(v, b.get(k, {})) if isinstance(v, dict) else v + b.get(k, 0) for k, v in a.items()}
