"""The lstm predictor trains on a tiny synthetic trace, its checkpoint round-trips, and a missing or
incompatible checkpoint is refused with the reason and the fix."""
import numpy as np
import pytest
import torch

from sgl_ess.config import EssConfigError, build_config
from sgl_ess.prefetch.lstm_model import FORMAT, HotnessLSTM, load_checkpoint, save_checkpoint
from sgl_ess.prefetch.predictors import PredictorContext, make_predictor
from sgl_ess.prefetch.synthetic_trace import SyntheticTraceConfig, generate
from sgl_ess.prefetch.trace_format import write_trace
from sgl_ess.prefetch.train_lstm import _metrics, main, segments, train
from tests.unit.prefetch.scratch import inductor_cache_outside_the_temp_base, scratch  # noqa: F401 (fixtures)

TINY = SyntheticTraceConfig(num_layers=3, topk=16, context_tokens=256, steps=30, requests=2, hot_slots_per_request=40)


@pytest.fixture(scope="module")
def trace():
    return generate(TINY)


def test_training_lowers_the_held_out_loss(trace):
    torch.manual_seed(0)
    x, y, m = segments(trace, horizon=24, max_len=16, max_segments=300)
    assert x.shape[1:] == (16, 4) and float(m.sum()) > 0
    before = _metrics(HotnessLSTM(8), x, y, m, 0.1)["loss"]
    model, metrics = train(trace, hidden=8, max_len=16, max_segments=300, epochs=3, log=lambda _: None)
    assert metrics["epochs"] == 3 and metrics["held_out"]["sequences"] > 0
    assert _metrics(model, x, y, m, 0.1)["loss"] < before


def test_checkpoint_round_trips_and_loads_as_the_predictor(trace, scratch):
    path = str(scratch / "lstm.pt")
    write_trace(str(scratch / "t.jsonl"), trace)
    assert main(["--trace", str(scratch / "t.jsonl"), "--out", path, "--hidden", "8", "--epochs", "1",
                 "--max-segments", "200", "--max-len", "16"]) == 0
    model, meta = load_checkpoint(path)
    assert meta["format"] == FORMAT and meta["hidden"] == 8 and meta["trained_on"]["source"] == "synthetic"
    again = str(scratch / "again.pt")
    save_checkpoint(again, model, meta["horizon"], meta["threshold"], meta["trained_on"], meta["metrics"])
    model2, _ = load_checkpoint(again)
    for (k1, v1), (k2, v2) in zip(model.state_dict().items(), model2.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)
    x = torch.rand(5, 4)
    h = torch.zeros(5, 8)
    torch.testing.assert_close(model.step(x, h, h)[0], model2.step(x, h, h)[0])
    p = make_predictor("lstm", PredictorContext(3, 16, 512, path))
    target, pos = p.predict(0, 3, torch.tensor([0]), torch.tensor([300]), torch.tensor([[1, 2, 3, -1]]))
    assert target == 1 and np.asarray(pos).shape[0] == 1


def test_bad_checkpoints_are_refused_with_the_fix(scratch):
    with pytest.raises(FileNotFoundError, match="--ess-predictor-checkpoint.*train_lstm"):
        load_checkpoint(str(scratch / "missing.pt"))
    junk = scratch / "junk.pt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a sgl_ess.lstm_predictor/1 checkpoint"):
        load_checkpoint(str(junk))
    other = scratch / "other.pt"
    torch.save({"format": "someone_else/3"}, other)
    with pytest.raises(ValueError, match="'someone_else/3'; expected 'sgl_ess.lstm_predictor/1'"):
        load_checkpoint(str(other))
    good = scratch / "good.pt"
    save_checkpoint(str(good), HotnessLSTM(4), 24, 0.1, {}, {})
    ck = torch.load(good, weights_only=True)
    torch.save({**ck, "features": ["selected", "age"]}, scratch / "old.pt")
    with pytest.raises(ValueError, match="retrain"):
        load_checkpoint(str(scratch / "old.pt"))
    torch.save({**ck, "hidden": 8}, scratch / "shape.pt")
    with pytest.raises(ValueError, match="hidden size 8"):
        load_checkpoint(str(scratch / "shape.pt"))


def test_config_requires_an_existing_checkpoint_for_lstm(scratch):
    with pytest.raises(EssConfigError, match="predictor_checkpoint"):
        build_config(None, {"speculative_prefetch": "lstm"}, environ={})
    with pytest.raises(EssConfigError, match="does not exist"):
        build_config(None, {"speculative_prefetch": "lstm", "predictor_checkpoint": str(scratch / "x.pt")}, environ={})
    ck = scratch / "c.pt"
    save_checkpoint(str(ck), HotnessLSTM(4), 24, 0.1, {}, {})
    cfg = build_config(None, {"speculative_prefetch": "lstm", "predictor_checkpoint": str(ck),
                              "predictor_min_precision": "0.2", "predictor_window": "16"}, environ={})
    assert cfg.speculative_prefetch == "lstm" and cfg.predictor_min_precision == 0.2 and cfg.predictor_window == 16
    for name in ("last_step", "score_ema", "next_layer", "off"):
        assert build_config(None, {"speculative_prefetch": name}, environ={}).speculative_prefetch == name
    with pytest.raises(EssConfigError, match="allowed: off, next_layer, last_step, score_ema, lstm"):
        build_config(None, {"speculative_prefetch": "oracle"}, environ={})


def test_one_step_cell_equals_the_lstm_over_a_sequence():
    torch.manual_seed(3)
    model = HotnessLSTM(8)
    x = torch.rand(6, 5, 4)
    want = model(x)
    h = c = torch.zeros(6, 8)
    for t in range(5):
        logit, h, c = model.step(x[:, t], h, c)
        torch.testing.assert_close(logit, want[:, t].detach(), rtol=1e-5, atol=1e-6)
