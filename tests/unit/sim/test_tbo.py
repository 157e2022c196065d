"""The TBO stage schedule: executor order, hand-computed timelines, and its bounds."""
import pytest

from sgl_ess.sim.tbo import Fetch, LayerStages, Schedule, executor_order, serial, stage_of, tbo


def test_executor_order_matches_sglang_delta_two():
    # A runs two stages ahead, then A and B alternate, then B finishes its last two stages
    assert executor_order(5) == [(0, 0), (0, 1), (0, 2), (1, 0), (0, 3), (1, 1), (0, 4), (1, 2), (1, 3), (1, 4)]
    order = executor_order(15)
    assert sorted(order) == [(mb, k) for mb in (0, 1) for k in range(15)]


def test_stage_of_places_the_ops_of_a_layer():
    assert stage_of("attn.q_a_kv_a", "attn_in") == 0 and stage_of("indexer.score", "indexer") == 0
    assert stage_of("ess.resolve", "indexer") == 0 and stage_of("moe.add", "ffn") == 0
    assert stage_of("attention.sparse", "attention") == 1 and stage_of("attn.o_proj", "post_attn") == 1
    assert stage_of("moe.router", "ffn") == 1
    assert stage_of("moe.shared_up", "ffn") == 2 and stage_of("ffn.up", "ffn") == 2
    assert stage_of("moe.experts_down", "ffn") == 3
    with pytest.raises(ValueError, match="no TBO stage"):
        stage_of("moe.dispatch", "comm")


def test_without_communication_the_schedule_is_the_sum_of_compute():
    a = [LayerStages((1.0, 2.0, 3.0, 4.0, 0.0)) for _ in range(3)]
    b = [LayerStages((0.5, 1.5, 2.5, 3.5, 0.0)) for _ in range(3)]
    assert tbo(a, b).total_us == pytest.approx(3 * 10.0 + 3 * 8.0)


def test_one_layer_by_hand():
    # A: T0=1 T1=2 T2=3 T3=4 T4=0, dispatch 10, combine 1; B the same stages, no communication.
    a = [LayerStages((1.0, 2.0, 3.0, 4.0, 0.0), dispatch_us=10.0, combine_us=1.0)]
    b = [LayerStages((1.0, 2.0, 3.0, 4.0, 0.0))]
    # A0 [0,1] A1 [1,3] A2 [3,6] (dispatch issued at 3, arrives 13) B0 [6,7]
    # A3 waits for 13: [13,17], combine sent at 17, arrives 18; B1 [17,19]
    # A4 [19,19] (combine already there); B2 [19,22] B3 [22,26] B4 [26,26]: 6 more than the compute
    assert tbo(a, b).total_us == pytest.approx(26.0)
    # the same dispatch short enough to hide behind A's T2 and B's T0 costs nothing
    short = [LayerStages((1.0, 2.0, 3.0, 4.0, 0.0), dispatch_us=4.0, combine_us=1.0)]
    assert tbo(short, b).total_us == pytest.approx(20.0)


def test_two_layers_by_hand():
    # each stage 1, dispatch 3, combine 2, both micro-batches, two layers: the waits carry across layers
    s = [LayerStages((1.0, 1.0, 1.0, 1.0, 0.0), dispatch_us=3.0, combine_us=2.0)] * 2
    # A0 [0,1] A1 [1,2] A2 [2,3] (A dispatch 2-5) B0 [3,4] A3 [5,6] (A combine 6-8) B1 [6,7] A4 [8,8]
    # B2 [8,9] (B dispatch 8-11) A'0 [9,10] B3 [11,12] (B combine 12-14) A'1 [12,13] B4 [14,14]
    # A'2 [14,15] (A dispatch 14-17) B'0 [15,16] A'3 [17,18] (A combine 18-20) B'1 [18,19] A'4 [20,20]
    # B'2 [20,21] (B dispatch 20-23) B'3 [23,24] (B combine 24-26) B'4 [26,26]
    assert tbo(s, s).total_us == pytest.approx(26.0)


def test_schedule_is_between_the_ideal_overlap_and_no_overlap():
    a = [LayerStages((30.0, 40.0, 10.0, 20.0, 0.0), dispatch_us=25.0, combine_us=45.0) for _ in range(4)]
    b = [LayerStages((30.0, 40.0, 10.0, 20.0, 0.0), dispatch_us=25.0, combine_us=45.0) for _ in range(4)]
    t = tbo(a, b).total_us
    compute = sum(s.compute_total_us for s in a + b)
    comm = sum(s.dispatch_us + s.combine_us for s in a + b)
    assert max(compute, comm) <= t < serial(a).total_us + serial(b).total_us
    # more communication never makes it faster
    more = [LayerStages(s.compute_us, s.dispatch_us, s.combine_us * 2) for s in a]
    assert tbo(more, more).total_us >= t


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="5 non-negative"):
        LayerStages((1.0, 2.0))
    with pytest.raises(ValueError, match="same"):
        tbo([LayerStages((0.0,) * 5)], [])


def test_fetch_without_tbo_hides_behind_its_own_pre_attention_and_attn0():
    # T0 = 10 (the chunk is sent at 4, after the indexer), T1 = 6 with the wait 2 into it (after Attn0)
    def layer(fetch_us):
        return [LayerStages((10.0, 6.0, 0.0, 0.0, 0.0), fetch=Fetch(((4.0, fetch_us),), 1, 2.0))]
    assert serial(layer(8.0)) == Schedule(16.0, 0.0, 0.0)          # in by 12, needed at 12
    assert serial(layer(11.0)) == Schedule(19.0, 3.0, 0.0)         # in by 15: 3 us exposed


def test_fetch_hides_behind_the_other_micro_batch_under_tbo():
    # every stage 1 us, except B's first-layer routed experts (T3) of 10 us; A's second layer fetches
    # 9 us sent at the start of its T0 and awaited at the start of its T1. Between them SGLang runs B's T3:
    # A0 [0,1] A1 [1,2] A2 [2,3] B0 [3,4] A3 [4,5] B1 [5,6] A4 [6,6] B2 [6,7] A'0 [7,8] (sent at 7, in at 16)
    # B3 [8,18] A'1 needs it at 18: hidden, and the step is the 25 us of compute. Alone it would wait 8.
    ones = (1.0,) * 4 + (0.0,)

    def run(fetch_us):
        a = [LayerStages(ones), LayerStages(ones, fetch=Fetch(((0.0, fetch_us),), 1, 0.0))]
        b = [LayerStages((1.0, 1.0, 1.0, 10.0, 0.0)), LayerStages(ones)]
        return tbo(a, b)
    assert run(9.0) == Schedule(25.0, 0.0, 0.0)
    assert run(12.0) == Schedule(26.0, 1.0, 0.0)                   # in at 19: the last 1 us waits
    alone = [LayerStages(ones), LayerStages(ones, fetch=Fetch(((0.0, 9.0),), 1, 0.0))]
    assert serial(alone).fetch_wait_us == pytest.approx(8.0)       # only its own T0 (1 us) in between


def test_fetch_chunks_share_the_link():
    # DBA: half 0 sent at 0, half 1 at 1 (after the second indexer half); the link carries one at a time
    s = [LayerStages((2.0, 3.0, 0.0, 0.0, 0.0), fetch=Fetch(((0.0, 5.0), (1.0, 5.0)), 1, 0.0))]
    assert serial(s) == Schedule(13.0, 8.0, 0.0)                   # in at 10, needed at 2
    with pytest.raises(ValueError, match="inside T0"):
        LayerStages((2.0, 3.0, 0.0, 0.0, 0.0), fetch=Fetch(((3.0, 5.0),), 1, 0.0))


def test_blocking_communication_is_booked_as_a_wait():
    s = [LayerStages((1.0, 1.0, 1.0, 1.0, 0.0), dispatch_us=3.0, combine_us=2.0)]
    assert serial(s) == Schedule(9.0, 0.0, 5.0)
    assert tbo(s, s).comm_wait_us == pytest.approx(tbo(s, s).total_us - 8.0)
