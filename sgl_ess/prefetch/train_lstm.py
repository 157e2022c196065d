"""Train the lstm predictor offline on a top-k trace (torch, CPU):

    python -m sgl_ess.prefetch.train_lstm --trace FILE --out CKPT [--hidden 16] [--epochs 8]
                                          [--max-segments 12000] [--max-seconds 60] [--threads 1]

The trace is `sgl_ess.topk_trace/1` (record one from a server with `python -m bench trace --out FILE`,
or generate a synthetic one with `python -m bench trace --synthetic --out FILE`). Training sequences
are the lifetimes of tracked positions, exactly as the predictor's PositionTable keeps them: from a
position's first selection in a (request, layer) until `horizon` steps after its last (capped at
`--max-len` steps, sampled evenly over the (request, layer) pairs up to `--max-segments`); the loss is
binary cross-entropy on "selected at the next step" at every step the position is NOT selected (the
only steps where the predictor would stage it). 10% of the sequences are held out; their precision
and recall at the threshold are written into the checkpoint with the trace's header.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from sgl_ess.prefetch.lstm_model import HotnessLSTM, features, save_checkpoint
from sgl_ess.prefetch.trace_format import Trace, read_trace


def layer_sequences(trace: Trace):
    """Yield (layer, sets [T] of int64 arrays, seq_lens int64 [T]) per (request lifetime, layer)."""
    live: dict[tuple[int, int], tuple[list, list]] = {}
    for ev in trace.events:
        if ev["ev"] in ("open", "close"):
            for key in [key for key in live if key[0] == ev["req"]]:
                sets, lens = live.pop(key)
                yield key[1], sets, np.asarray(lens, dtype=np.int64)
        elif ev["ev"] == "plan":
            for r, s, row in zip(ev["reqs"].tolist(), ev["seq_lens"].tolist(), ev["topk"]):
                sets, lens = live.setdefault((r, ev["layer"]), ([], []))
                sets.append(row[row >= 0])
                lens.append(s)
    for (_, layer), (sets, lens) in live.items():
        yield layer, sets, np.asarray(lens, dtype=np.int64)


def segments(trace: Trace, horizon: int, max_len: int, max_segments: int, seed: int = 0):
    """-> (x float32 [N, max_len, 4], y float32 [N, max_len], mask float32 [N, max_len])."""
    rng = np.random.default_rng(seed)
    seqs = [s for s in layer_sequences(trace) if len(s[1]) >= 2]
    if not seqs:
        raise ValueError("the trace has no (request, layer) with two or more plans: nothing to learn from")
    quota = max(1, max_segments // len(seqs))
    L = trace.num_layers
    xs, ys, ms = [], [], []
    for layer, sets, lens in seqs:
        T = len(sets)
        sel = np.zeros((T, int(lens.max())), dtype=bool)
        for t, s in enumerate(sets):
            sel[t, s] = True
        cols = np.nonzero(sel.any(axis=0))[0]
        for p in rng.choice(cols, size=min(quota, cols.size), replace=False):
            times = np.nonzero(sel[:, p])[0]
            cut = np.nonzero(np.diff(times) > horizon)[0]
            j = rng.integers(cut.size + 1)                  # one of the position's lifetimes
            s, e = times[np.r_[0, cut + 1][j]], times[np.r_[cut, times.size - 1][j]]
            ts = np.arange(s, min(e + horizon - 1, T - 1, s + max_len - 1) + 1)
            x = sel[ts, p]
            last = np.maximum.accumulate(np.where(x, ts, -1))
            f = features(x, ts - last, np.full(ts.size, p), lens[ts], layer, L, horizon)
            pad = max_len - ts.size
            xs.append(np.pad(f, ((0, pad), (0, 0))))
            ys.append(np.pad(sel[np.minimum(ts + 1, T - 1), p].astype(np.float32), (0, pad)))
            ms.append(np.pad((~x & (ts + 1 < T)).astype(np.float32), (0, pad)))
    return (torch.from_numpy(np.stack(xs)), torch.from_numpy(np.stack(ys)), torch.from_numpy(np.stack(ms)))


def _metrics(model: HotnessLSTM, x, y, m, threshold: float) -> dict:
    with torch.no_grad():
        logit = model(x)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logit, y, weight=m, reduction="sum") / m.sum()
        pred = (torch.sigmoid(logit) >= threshold) & (m > 0)
        pos = (y > 0) & (m > 0)
        tp = int((pred & pos).sum())
    return {"loss": round(float(loss), 5), "precision": round(tp / max(1, int(pred.sum())), 4),
            "recall": round(tp / max(1, int(pos.sum())), 4), "positive_rate": round(float(pos.sum() / m.sum()), 4),
            "sequences": int(x.shape[0])}


def train(trace: Trace, hidden: int = 16, horizon: int = 24, max_len: int = 48, max_segments: int = 12000,
          epochs: int = 8, max_seconds: float = 60.0, threshold: float = 0.1, seed: int = 0, log=print):
    """-> (model, metrics). Stops after `epochs` or `max_seconds`, whichever comes first."""
    torch.manual_seed(seed)
    x, y, m = segments(trace, horizon, max_len, max_segments, seed)
    perm = torch.randperm(x.shape[0])
    n_val = max(1, x.shape[0] // 10)
    val, tr = perm[:n_val], perm[n_val:]
    if tr.numel() == 0:
        tr = val
    model = HotnessLSTM(hidden)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    t0 = time.monotonic()
    done = 0
    for epoch in range(epochs):
        order = tr[torch.randperm(tr.numel())]
        for i in range(0, order.numel(), 256):
            b = order[i:i + 256]
            w = m[b]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[b]), y[b], weight=w,
                                                                        reduction="sum") / w.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
        done = epoch + 1
        log(f"epoch {done}: held-out {_metrics(model, x[val], y[val], m[val], threshold)} "
            f"({time.monotonic() - t0:.1f} s)")
        if time.monotonic() - t0 > max_seconds:
            break
    model.eval()
    metrics = {"held_out": _metrics(model, x[val], y[val], m[val], threshold), "epochs": done,
               "train_seconds": round(time.monotonic() - t0, 2), "train_sequences": int(tr.numel())}
    return model, metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sgl_ess.prefetch.train_lstm", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True, help="sgl_ess.topk_trace/1 JSONL file")
    p.add_argument("--out", required=True, help="checkpoint to write (--ess-predictor-checkpoint loads it)")
    p.add_argument("--hidden", type=int, default=16, help="LSTM hidden size (default 16)")
    p.add_argument("--horizon", type=int, default=24, help="steps a position stays tracked after its last selection")
    p.add_argument("--max-len", type=int, default=48, help="longest training sequence in steps (default 48)")
    p.add_argument("--max-segments", type=int, default=12000, help="training sequences in all (default 12000)")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop after the epoch that passes this")
    p.add_argument("--threshold", type=float, default=0.1,
                   help="stage a row when P(selected next) >= this (default 0.1: --ess-predictor-min-precision's "
                        "default; a row staged below the gate's precision cannot keep the gate open)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    trace = read_trace(a.trace)
    model, metrics = train(trace, a.hidden, a.horizon, a.max_len, a.max_segments, a.epochs, a.max_seconds,
                           a.threshold, a.seed)
    trained_on = {k: v for k, v in trace.header.items() if k != "configured_overlap"}
    trained_on["path"] = a.trace
    save_checkpoint(a.out, model, a.horizon, a.threshold, trained_on, metrics)
    print(f"wrote {a.out}: held-out {metrics['held_out']} (trace source: {trace.header.get('source')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
