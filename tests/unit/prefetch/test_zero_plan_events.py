"""Issue 32 (review of defect 3's fix): `PlanEvents` forgets finished events once more than `cap` are
pending. A zero plan's event used to live there, so a release whose own event had been forgotten found
none in `StreamEngine.complete`, which raised "already waited on" - on SGLang's allocator free, a
scheduler crash. Zero plans now keep their events in their own table; and `complete` on any plan whose
event was forgotten as finished returns (it is done)."""
import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.stream_engine import PlanEvents, StreamEngine
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import make_store

LAYERS, RB = 2, 16


def _engine():
    store, _ = make_store(layers=LAYERS, row_bytes=RB, host_tokens=64, n=8, max_requests=2, k=4, max_context=32)
    streams = LateStreams(seed=2)
    eng = StreamEngine(store.memory, "torch", device="cpu", runtime=streams, zero_backend="torch")
    eng.events = PlanEvents(eng._join, cap=4)
    return store, eng, streams


def _copies(eng, streams, n):
    tickets = []
    for i in range(n):
        tickets.append(eng.submit(CopyPlan("h2s", torch.tensor([i]), torch.tensor([i]), layer=0)))
        streams.finish()                          # each copy's event is finished: PlanEvents may forget it
    return tickets


def test_complete_finds_a_zero_plan_after_finished_events_were_forgotten():
    store, eng, streams = _engine()
    try:
        locs = torch.arange(8, 16)
        store.host.rows[:, locs] = 7
        zero = eng.submit(CopyPlan("zero", torch.full_like(locs, -1), locs, tier="background"))
        streams.finish()
        _copies(eng, streams, 6)                  # past the cap of 4: finished events dropped
        eng.complete(zero)                        # raised RuntimeError when its event had been dropped
        assert int(store.host.rows[:, locs].count_nonzero()) == 0
    finally:
        store.shutdown()


def test_complete_on_a_forgotten_finished_copy_returns():
    store, eng, streams = _engine()
    try:
        first = _copies(eng, streams, 6)[0]
        assert first.plan_id not in eng.events.pending
        eng.complete(first)                       # forgotten because it finished: done, no error
    finally:
        store.shutdown()
