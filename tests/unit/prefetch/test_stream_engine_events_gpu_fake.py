"""GPU fake: the StreamEngine's table of plan events (PlanEvents), with stand-ins for CUDA events
(`query()` says whether the device finished the plan) and for the stream join. Issue 16: the
engine used to forget the oldest events past 4096, so a later wait on such a ticket ordered
nothing and the compute stream could read a ring row before the copy that fills it."""

from sgl_ess.prefetch.stream_engine import PlanEvents


class FakeEvent:
    def __init__(self, finished: bool):
        self.finished = finished

    def query(self) -> bool:
        return self.finished


def test_past_the_cap_only_finished_events_are_forgotten():
    joins = []
    ev = PlanEvents(lambda: joins.append(1), cap=8)
    for pid in range(9):                       # plans 0..5 finished on the device, 6..8 still running
        ev.add(pid, FakeEvent(finished=pid < 6))
    assert sorted(ev.pending) == [6, 7, 8] and not joins
    assert ev.done(2) and not ev.done(6)
    assert ev.pop(7) is not None and ev.pop(7) is None


def test_past_the_cap_with_work_pending_the_compute_stream_joins_before_forgetting():
    joins, join_event = [], FakeEvent(finished=False)

    def join():
        joins.append(len(ev))
        return join_event

    ev = PlanEvents(join, cap=8)
    for pid in range(9):                       # nothing finished: none may be forgotten unordered
        ev.add(pid, FakeEvent(finished=False))
    assert joins == [9] and len(ev) == 0 and ev.joins == 1     # joined while all nine were pending
    assert not ev.done(3)                      # forgotten, but its copy may still run: the join's event says
    join_event.finished = True
    assert ev.done(3)
    ev.add(9, FakeEvent(finished=False))
    assert 9 in ev.pending and not ev.done(9) and ev.joins == 1
