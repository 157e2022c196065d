"""Protocol: runs encoding (lossless, compressed), every message type round-trips, bad input is
named, and the completion ledger answers exactly."""
import numpy as np
import pytest
import torch

from sgl_ess.prefetch.plan import CopyPlan
from sgl_ess.prefetch.protocol import (PROTOCOL_VERSION, CompletionLedger, Done, Error, Heartbeat, PlanMsg,
                                       ProtocolError, Ready, Stop, decode, decode_runs, encode, encode_runs,
                                       plan_message)


def _roundtrip(src, dst):
    runs = encode_runs(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
    s, d = decode_runs(runs)
    return runs, s, d


@pytest.mark.parametrize("seed", range(20))
def test_runs_roundtrip_random(seed):
    rng = np.random.default_rng(seed)
    pieces_s, pieces_d = [], []
    for _ in range(int(rng.integers(1, 30))):
        n = int(rng.choice([1, 1, 2, 7, 300]))
        kind = rng.integers(0, 4)
        if kind == 0:     # a run on both sides
            a, b = rng.integers(0, 10**6, 2)
            pieces_s.append(np.arange(a, a + n)); pieces_d.append(np.arange(b, b + n))
        elif kind == 1:   # scattered
            pieces_s.append(rng.integers(0, 10**6, n)); pieces_d.append(rng.integers(0, 10**6, n))
        elif kind == 2:   # -1 source (zero plans, skipped entries) with consecutive destinations
            b = rng.integers(0, 10**6)
            pieces_s.append(np.full(n, -1)); pieces_d.append(np.arange(b, b + n))
        else:             # -1 on both sides / padding
            pieces_s.append(np.full(n, -1)); pieces_d.append(np.where(rng.random(n) < 0.5, -1, rng.integers(0, 99, n)))
    src, dst = np.concatenate(pieces_s), np.concatenate(pieces_d)
    runs, s, d = _roundtrip(src, dst)
    assert np.array_equal(s, src) and np.array_equal(d, dst)
    assert runs.shape[1] == 3 and int(runs[:, 2].sum()) == src.shape[0]
    assert runs.shape[0] <= src.shape[0]


def test_runs_compression_and_edges():
    runs, s, d = _roundtrip(np.arange(5, 100_005), np.arange(7, 100_007))
    assert runs.tolist() == [[5, 7, 100_000]]
    runs, s, d = _roundtrip(np.r_[np.arange(10, 20), np.full(50, -1)], np.r_[np.arange(0, 10), np.full(50, -1)])
    assert runs.tolist() == [[10, 0, 10], [-1, -1, 50]]
    runs, s, d = _roundtrip([3], [9])
    assert runs.tolist() == [[3, 9, 1]]
    runs, s, d = _roundtrip([1, 2, 3, 9], [4, 5, 7, 8])   # dst breaks at 7, src breaks at 9
    assert runs.tolist() == [[1, 4, 2], [3, 7, 1], [9, 8, 1]]
    runs, s, d = _roundtrip([], [])
    assert runs.shape == (0, 3) and s.shape == (0,) and d.shape == (0,)
    runs, s, d = _roundtrip([-5, -1, 4], [2, 3, -7])       # any negative means skip: normalised to -1
    assert s.tolist() == [-1, -1, 4] and d.tolist() == [2, 3, -1]


def test_runs_bad_input():
    with pytest.raises(ProtocolError, match="1-D of one length"):
        encode_runs(np.arange(3), np.arange(4))
    with pytest.raises(ProtocolError, match="run lengths must be >= 1, got \\[0\\]"):
        decode_runs(np.array([[1, 2, 0]]))


def test_plan_message_roundtrip():
    src = torch.tensor([4, 5, 6, -1, -1, 100, 7], dtype=torch.int64)
    dst = torch.tensor([10, 11, 12, 13, 14, -1, 0], dtype=torch.int64)
    plan = CopyPlan("h2s", src, dst, layer=2, tier="speculative", micro_batch=1, tag_seq=1 << 40,
                    deadline_s=12.5, plan_id=77)
    msg = decode(encode(plan_message(plan)))
    assert isinstance(msg, PlanMsg)
    assert (msg.id, msg.kind, msg.layer, msg.mb, msg.tier, msg.deadline, msg.tag, msg.n) == \
        (77, "h2s", 2, 1, "speculative", 12.5, 1 << 40, 7)
    s, d = msg.indices()
    assert s.tolist() == src.tolist() and d.tolist() == dst.tolist()
    assert msg.runs.tolist() == [[4, 10, 3], [-1, 13, 2], [100, -1, 1], [7, 0, 1]]


def test_plan_message_needs_cpu_integer_indices():
    plan = CopyPlan("h2s", torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="float32 on cpu; expected int64.*--ess-prefetch-engine inline"):
        plan_message(plan)


@pytest.mark.parametrize("msg", [Ready(version=PROTOCOL_VERSION, pid=123, inc=4),
                                 Done(inc=1, id=9, rows=300, busy_us=17, dropped=False),
                                 Done(inc=1, id=10, rows=0, busy_us=0, dropped=True),
                                 Heartbeat(inc=2), Error(inc=0, id=-1, msg="boom"), Stop()])
def test_control_messages_roundtrip(msg):
    assert decode(encode(msg)) == msg


def test_decode_names_bad_messages():
    with pytest.raises(ProtocolError, match="not JSON"):
        decode(b"\x00garbage")
    with pytest.raises(ProtocolError, match="type 'nope'; expected one of ready, plan"):
        decode(b'{"t": "nope"}')
    with pytest.raises(ProtocolError, match="type 'list'"):
        decode(b"[1, 2]")
    with pytest.raises(ProtocolError, match="Done message with fields"):
        decode(b'{"t": "done", "id": 3}')
    with pytest.raises(ProtocolError, match="kind 'h2x'"):
        decode(b'{"t":"plan","id":1,"kind":"h2x","layer":0,"mb":0,"tier":"immediate","deadline":null,'
               b'"tag":-1,"n":1,"runs":[1,2,1]}')
    bad_n = decode(b'{"t":"plan","id":1,"kind":"h2s","layer":0,"mb":0,"tier":"immediate","deadline":null,'
                   b'"tag":-1,"n":5,"runs":[1,2,1]}')
    with pytest.raises(ProtocolError, match="runs cover 1 entries; header says n=5"):
        bad_n.indices()


def test_ledger_marks_and_wraps():
    owner = CompletionLedger(8)
    peer = CompletionLedger(8, fd=owner.fd)                # what the worker maps
    assert [owner.status(i) for i in range(8)] == [None] * 8    # initialised: id 0 is not "done"
    peer.mark(3, dropped=False)
    peer.mark(4, dropped=True)
    assert (owner.status(3), owner.status(4), owner.status(5)) == ("done", "dropped", None)
    peer.mark(11, dropped=False)                           # same slot as 3: 3 is no longer answered
    assert owner.status(11) == "done" and owner.status(3) is None and owner.status(19) is None
    peer.close()
    owner.close()
    owner.close()                                          # idempotent
