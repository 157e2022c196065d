"""pools/graph_steps.py: what a replayed decode graph counts on the host (the GPU-fake graph test
checks the same end to end through the CUDA backend)."""

from sgl_ess.integration.sglang.pools.graph_steps import GraphSteps


def _c(early, late, immediate):
    return {"plans_early": early, "plans_late": late, "tiers": {"immediate": immediate, "background": 0}}


def test_a_capture_run_is_taken_back_and_counted_per_replay_of_its_size():
    g = GraphSteps()
    assert g.usage() == {} and g.close(_c(0, 0, 0)) is None          # nothing was captured
    g.begin_capture(4)
    assert g.capturing
    g.before_capture(_c(2, 0, 2))            # after warm-up 1
    g.before_capture(_c(4, 0, 4))            # after warm-up 2: the capture's run comes next
    assert g.close(_c(7, 0, 7)) == _c(4, 0, 4)                        # its 3 plans ran on no device
    assert not g.capturing
    g.begin_capture(2)
    g.before_capture(_c(4, 0, 4))
    assert g.close(_c(6, 1, 7)) == _c(4, 0, 4)
    assert g.replay(4, 3) == _c(3, 0, 3) and g.replay(2, 1) == _c(2, 1, 3) and g.replay(8, 5) == {}
    assert g.usage() == {"graph_captures": 2, "graph_replays": 3, "graph_rows": 9}
