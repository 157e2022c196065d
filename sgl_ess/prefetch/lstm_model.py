"""The lstm predictor's model, its per-position features, and its checkpoint (torch, CPU).

One sequence per tracked position of one (request, layer): at each step of that layer the input is
  selected   1 if the position is in this step's top-k, else 0
  age        steps since its last selection / horizon (0 when selected now)
  distance   log2(1 + seq_len - 1 - position) / 17 (how far back in the context it lies)
  layer      layer / (num_layers - 1)
and the output is the logit of P(selected at the layer's next step). A sequence starts, with a zero
state, at a position's first selection and ends `horizon` steps after its last one (PositionTable's
lifetime), in training (train_lstm.py) exactly as in serving (lstm_predictor.py, which advances all
tracked positions of a step by one LSTM step in one batched call).

Checkpoint (torch.save of plain types + tensors, loaded with weights_only=True):
  {"format": FORMAT, "features": FEATURES, "hidden": H, "horizon": h, "threshold": p,
   "state_dict": ..., "trained_on": {...trace header...}, "metrics": {...}}
"""
from __future__ import annotations

import os

import numpy as np
import torch
from torch import nn

FORMAT = "sgl_ess.lstm_predictor/1"
FEATURES = ("selected", "age", "distance", "layer")
DISTANCE_SCALE = 17.0          # log2(1 + 128K): the longest context maps to ~1


def features(x: np.ndarray, age: np.ndarray, pos: np.ndarray, seq_len: np.ndarray | int, layer: int,
             num_layers: int, horizon: int) -> np.ndarray:
    """float32 [C, 4] for C tracked positions (x bool [C], age int [C], pos int [C])."""
    dist = np.maximum(np.asarray(seq_len) - 1 - pos, 0)
    out = np.empty((pos.size, len(FEATURES)), dtype=np.float32)
    out[:, 0] = x
    out[:, 1] = np.minimum(age, horizon) / horizon
    out[:, 2] = np.log2(1.0 + dist) / DISTANCE_SCALE
    out[:, 3] = layer / max(1, num_layers - 1)
    return out


class HotnessLSTM(nn.Module):
    def __init__(self, hidden: int = 16):
        super().__init__()
        self.hidden = hidden
        self.lstm = nn.LSTM(len(FEATURES), hidden, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x float32 [N, T, 4] -> logits float32 [N, T] (training: whole sequences from a zero state)."""
        y, _ = self.lstm(x)
        return self.head(y).squeeze(-1)

    @torch.no_grad()
    def step(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """One step of N sequences: x [N, 4], h / c [N, H] -> (logits [N], h [N, H], c [N, H]).
        The cell written out with nn.LSTM's own weights (gate order i, f, g, o): on the CPU this is
        several times cheaper than a one-step nn.LSTM call, and equal to it (test_lstm_checkpoint.py)."""
        gates = torch.addmm(self.lstm.bias_ih_l0 + self.lstm.bias_hh_l0, x, self.lstm.weight_ih_l0.t())
        gates.addmm_(h, self.lstm.weight_hh_l0.t())
        i, f, g, o = gates.chunk(4, dim=1)
        c1 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h1 = torch.sigmoid(o) * torch.tanh(c1)
        return self.head(h1).squeeze(-1), h1, c1


def save_checkpoint(path: str, model: HotnessLSTM, horizon: int, threshold: float, trained_on: dict,
                    metrics: dict) -> None:
    torch.save({"format": FORMAT, "features": list(FEATURES), "hidden": model.hidden, "horizon": int(horizon),
                "threshold": float(threshold), "state_dict": model.state_dict(), "trained_on": trained_on,
                "metrics": metrics}, path)


def load_checkpoint(path: str) -> tuple[HotnessLSTM, dict]:
    """-> (model in eval mode, the checkpoint's metadata). Raises FileNotFoundError / ValueError that
    say what was found, what was expected, and how to make a good one."""
    fix = "train one with `python -m sgl_ess.prefetch.train_lstm --trace FILE --out CKPT`"
    if not path:
        raise ValueError(f"the lstm predictor needs a checkpoint: set --ess-predictor-checkpoint ({fix})")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"lstm predictor checkpoint {path!r} does not exist (--ess-predictor-checkpoint); "
                                f"{fix}")
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:       # noqa: BLE001 - any unpickling failure means: not our checkpoint
        raise ValueError(f"{path}: not a {FORMAT} checkpoint ({type(e).__name__}: {e}); {fix}") from None
    if not isinstance(ck, dict) or ck.get("format") != FORMAT:
        got = ck.get("format") if isinstance(ck, dict) else type(ck).__name__
        raise ValueError(f"{path}: checkpoint format {got!r}; expected {FORMAT!r}; {fix}")
    if list(ck.get("features", [])) != list(FEATURES):
        raise ValueError(f"{path}: trained on features {ck.get('features')}; this version computes "
                         f"{list(FEATURES)}; retrain it ({fix})")
    model = HotnessLSTM(int(ck["hidden"]))
    try:
        model.load_state_dict(ck["state_dict"])
    except (RuntimeError, KeyError) as e:
        raise ValueError(f"{path}: weights do not fit an LSTM of hidden size {ck['hidden']}: {e}; {fix}") from None
    model.eval()
    meta = {k: v for k, v in ck.items() if k != "state_dict"}
    return model, meta
