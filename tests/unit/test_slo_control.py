"""Issue 19: the SLO batch controller (pure Python): it moves the running-request cap from measured
step times with hysteresis and a floor, never winds up while the load is below the cap, never winds
down while running requests drain to a lowered cap, and admits no more than SGLang itself would."""

import pytest

from sgl_ess.core.slo_control import SloBatchController, SloSettings, percentile


def _run(c, step_ms_of_batch, running_of_cap, steps, t0=0.0):
    t = t0
    for _ in range(steps):
        t += step_ms_of_batch(min(c.cap, running_of_cap)) / 1000.0
        c.step_done(t, min(c.cap, running_of_cap))
    return t


def _serve(c, step_ms_of_batch, requests, tokens, t0=0.0):
    """A scheduler that never preempts: `requests` queued at once, each decoding `tokens` steps,
    admitted only as c.admit allows. Returns (cap after each step, running after each step)."""
    t, queued, running, caps, sizes = t0, requests, [], [], []
    while queued or running:
        n = c.admit(len(running), queued)
        running += [tokens] * n
        queued -= n
        t += step_ms_of_batch(len(running)) / 1000.0
        c.step_done(t, len(running))
        running = [left - 1 for left in running if left > 1]
        caps.append(c.cap)
        sizes.append(len(running))
    return caps, sizes


def test_percentile_is_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 50) == 3 and percentile([5, 1, 3, 2, 4], 100) == 5
    assert percentile([], 50) == 0.0


def test_cap_settles_where_step_time_meets_the_target():
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=64, hysteresis=0.05))
    step = lambda b: 10.0 + 2.0 * b            # noqa: E731 - 20 requests -> 50 ms
    _run(c, step, running_of_cap=64, steps=2000)
    assert abs(step(c.cap) - 50.0) <= 50.0 * 0.05 + 2.0, c.state()     # within the band, +- one request
    assert c.changes > 0


def test_no_wind_down_while_running_requests_drain_to_a_lowered_cap():
    # 24 requests all start at once and run 96 steps each; a step costs 10 + 3.5 b ms, so the
    # target 50 ms is met at 11 requests. While the first 24 drain, every window is too slow, but
    # the cap must not fall below what that batch's timing asks for (the old rule lowered it by
    # cap // 8 every 8 steps, to the floor, before a single request had finished).
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=24))
    step = lambda b: 10.0 + 3.5 * b            # noqa: E731
    caps, _ = _serve(c, step, requests=24, tokens=96)
    assert min(caps) >= 11, caps
    caps, sizes = _serve(c, step, requests=200, tokens=96, t0=1000.0)
    mid = slice(len(caps) // 4, 3 * len(caps) // 4)
    steady = [cap for cap, n in zip(caps[mid], sizes[mid]) if n]
    assert set(steady) <= {11, 12}, sorted(set(steady))       # 11 -> 48.5 ms, 12 -> 52 ms: the band


def test_the_estimate_uses_the_targets_percentile():
    # a p90 target; one window at batch 10 (120 samples for a p90: 12 above it, as the median's 24
    # have): five steps of 40 ms, then one of 80 ms. The p90 is 80 ms, so 50 / (80 / 10) = 6
    # requests meet the target. An estimate from the median (40 ms) would say 12 and the cap would
    # only step down by one, then jump back up on the next fast window.
    s = SloSettings(target_ms=50.0, max_cap=10, percentile=90, window=24, every=120)
    assert s.decision_window == 120 and SloSettings(target_ms=1.0, max_cap=1).decision_window == 24
    c = SloBatchController(s)
    t = 0.0
    c.step_done(t, 10)                         # the first step end: no gap yet
    for i in range(120):
        t += (80.0 if i % 6 == 5 else 40.0) / 1000.0
        c.step_done(t, 10)
    assert c.measured_ms == pytest.approx(80.0) and c.cap == 6, c.state()


def test_a_p90_target_settles_under_bursty_steps():
    # 24 clients, requests of 64..128 tokens; a step costs 2 + 4 b ms and 15% of steps are 1.4x
    # slower. The p90 target 47.6 ms = 1.4 x (2 + 4 x 8): 8 requests meet it. From 24 samples a p90
    # rests on 2.4 of them and flips with every slow step: the old controller moved the cap between
    # 7 and 11, ~85 times per 400 requests. With the p90's own window and a bounded raise it changes
    # about a fifth as often (14-19 over seeds 0-9): at most once per 16 requests here.
    import random

    for seed in range(4):
        _bursty_p90(random.Random(seed))


def _bursty_p90(rnd):
    c = SloBatchController(SloSettings(target_ms=1.4 * (2 + 4 * 8), max_cap=24, percentile=90))
    t, running, waiting, done, steady = 0.0, [], 24, 0, []
    while done < 400:
        n = c.admit(len(running), waiting)
        running += [rnd.randint(64, 128) for _ in range(n)]
        waiting -= n
        t += (2 + 4 * len(running)) * (1.4 if rnd.random() < 0.15 else 1.0) / 1000.0
        c.step_done(t, len(running))
        if done >= 100:
            steady.append(c.cap)
        finished = sum(1 for left in running if left == 1)
        running = [left - 1 for left in running if left > 1]
        done, waiting = done + finished, waiting + finished
    assert 7 <= min(steady) and max(steady) <= 11, sorted(set(steady))
    assert c.changes <= 25, c.state()


def test_a_tail_target_lowers_the_cap_before_its_long_window_fills():
    # a p95 target (240-sample window) and every step far too slow: the median of the first 24
    # samples is already over the target, so the cap comes down then, not after 240 steps
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=32, percentile=95))
    assert c.window == 240
    _run(c, lambda b: 5.0 * b, running_of_cap=32, steps=25)
    assert c.cap < 32 and c.changes == 1, c.state()
    assert SloSettings(target_ms=50.0, max_cap=8, percentile=100).decision_window == 512   # no division by zero


def test_no_wind_up_below_the_cap_and_the_floor_holds():
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=64, floor=4))
    _run(c, lambda b: 5.0, running_of_cap=3, steps=500)     # fast steps but only 3 requests: cap stays
    assert c.cap == 64
    _run(c, lambda b: 500.0, running_of_cap=64, steps=2000, t0=100.0)   # every step too slow: floor
    assert c.cap == 4


def test_idle_gaps_are_not_samples_and_admit_never_exceeds_sglang():
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=8, every=1, window=1))
    c.step_done(0.0, 4)
    c.step_done(10.0, 4)                       # 10 s later: an idle server, not a 10 s TPOT
    assert c.cap == 8 and not c.samples
    assert c.admit(running=6, allocatable=5) == 2 and c.admit(running=2, allocatable=1) == 1
    assert c.admit(running=9, allocatable=5) == 0
    c = SloBatchController(SloSettings(target_ms=50.0, max_cap=8))
    for k in range(5):
        c.step_done(k * 0.04, 8)
    assert len(c.samples) == 4
    c.step_done(30.0, 2)                       # a new load after an idle pause: measured on its own
    assert not c.samples and not c.batches


@pytest.mark.parametrize("kw", [{"target_ms": 0}, {"percentile": 0}, {"floor": 0}, {"floor": 9}])
def test_bad_settings_name_the_flag(kw):
    base = dict(target_ms=10.0, max_cap=8)
    base.update(kw)
    with pytest.raises(ValueError, match="--ess-slo"):
        SloSettings(**base)
