"""Each speculative predictor's predictions on small hand-made traces, and its per-request state."""
import numpy as np
import pytest
import torch

from sgl_ess.prefetch.last_step import LastStepPredictor
from sgl_ess.prefetch.lstm_predictor import LstmPredictor
from sgl_ess.prefetch.position_table import PositionTable
from sgl_ess.prefetch.predictors import PREDICTORS, NextLayerPredictor, PredictorContext, make_predictor
from sgl_ess.prefetch.score_ema import ScoreEmaPredictor

CTX = PredictorContext(num_layers=2, topk=4, max_context_tokens=1000)


def _t(rows):
    return torch.tensor(rows, dtype=torch.int64)


def _call(p, layer, topk, reqs=(5,), num_layers=2, seq=100):
    target, pos = p.predict(layer, num_layers, _t(list(reqs)), _t([seq] * len(reqs)), _t(topk))
    return target, [[int(v) for v in row if v >= 0] for row in np.asarray(pos)]


def test_next_layer_is_this_layers_selection_for_the_next_layer():
    p = NextLayerPredictor(CTX)
    target, pos = p.predict(0, 2, _t([1]), _t([50]), _t([[3, 4, -1]]))
    assert target == 1 and pos.tolist() == [[3, 4, -1]]
    assert p.predict(1, 2, _t([1]), _t([50]), _t([[3, 4, -1]])) is None      # no layer after the last


def test_last_step_predicts_the_next_layers_previous_selection_and_wraps():
    p = LastStepPredictor(CTX)
    assert _call(p, 0, [[1, 2, 3, -1]]) == (1, [[]])             # layer 1 never ran yet
    assert _call(p, 1, [[7, 8, -1, -1]]) == (0, [[1, 2, 3]])     # after the last layer: layer 0, next step
    assert _call(p, 0, [[4, -1, -1, -1]]) == (1, [[7, 8]])
    assert _call(p, 1, [[9, -1, -1, -1]], reqs=(6,)) == (0, [[]])  # another request has its own state
    p.forget(5)
    assert _call(p, 1, [[9, -1, -1, -1]]) == (0, [[]])


def test_score_ema_ranks_by_moving_average_outside_the_current_set():
    p = ScoreEmaPredictor(PredictorContext(1, 4, 1000), alpha=0.5, horizon=8)
    # one layer: the target is the same layer, next step.  ema after the three steps:
    # 10: .5 .75 .875   20: .5 .25 .125   30: 0 .5 .25
    _call(p, 0, [[10, 20, -1]], num_layers=1)
    _call(p, 0, [[10, 30, -1]], num_layers=1)
    target, pos = _call(p, 0, [[10, -1, -1]], num_layers=1)
    assert target == 0 and pos == [[30, 20]]
    t = p.tables[5][0]
    np.testing.assert_allclose(t.state[:, 0], [0.875, 0.125, 0.25])    # positions 10, 20, 30 (sorted)


def test_score_ema_drops_positions_after_the_horizon_and_forgets_requests():
    p = ScoreEmaPredictor(PredictorContext(1, 4, 1000), alpha=0.5, horizon=2)
    _call(p, 0, [[10, 20]], num_layers=1)
    _call(p, 0, [[10, 30]], num_layers=1)
    assert _call(p, 0, [[10, -1]], num_layers=1)[1] == [[30]]        # 20: two steps unselected, gone
    p.forget(5)
    assert 5 not in p.tables and _call(p, 0, [[1, -1]], num_layers=1)[1] == [[]]


def test_position_table_memory_is_capped():
    t = PositionTable(state_dim=1, horizon=100, capacity=5)
    for step in range(10):
        t.observe(np.arange(step * 3, step * 3 + 3))
        assert len(t) <= 5 and np.all(np.diff(t.pos) > 0)
    assert set(t.pos.tolist()) >= {27, 28, 29}                        # the newest selection stays


class AgeModel:
    """A stand-in for the LSTM: P(next) grows with the age feature (column 1), so the prediction order
    is known: hidden state carried through untouched."""
    hidden = 2

    def step(self, x, h, c):
        return 20.0 * (x[:, 1] - 0.1), h + 1, c


def test_lstm_predicts_tracked_positions_above_threshold_most_probable_first():
    p = LstmPredictor(PredictorContext(1, 4, 1000), model=AgeModel(), meta={"horizon": 10, "threshold": 0.6})
    _call(p, 0, [[1, 2, 3]], num_layers=1)
    _call(p, 0, [[3, 4, -1]], num_layers=1)
    _call(p, 0, [[5, -1, -1]], num_layers=1)
    target, pos = _call(p, 0, [[6, -1, -1]], num_layers=1)
    # ages now: 1, 2 -> 3 (P .98), 3, 4 -> 2 (P .88), 5 -> 1 (P .5 < .6), 6 -> 0 (the current selection)
    assert target == 0 and pos == [[1, 2, 3, 4]]
    t = p.tables[5][0]
    assert t.pos.tolist() == [1, 2, 3, 4, 5, 6]
    assert t.state[:, 0].tolist() == [4, 4, 4, 3, 2, 1]    # h advanced once per step since each one entered
    p.forget(5)
    assert p.tables == {}


def test_every_table_entry_builds_and_unknown_names_are_refused():
    assert set(PREDICTORS) == {"off", "next_layer", "last_step", "score_ema", "lstm"}
    for name in ("next_layer", "last_step", "score_ema"):
        assert make_predictor(name, CTX).name == name
    assert make_predictor("off", CTX) is None
    with pytest.raises(ValueError, match="--ess-speculative-prefetch"):
        make_predictor("oracle", CTX)
    with pytest.raises(ValueError, match="--ess-predictor-checkpoint"):
        make_predictor("lstm", CTX)                      # no checkpoint given
