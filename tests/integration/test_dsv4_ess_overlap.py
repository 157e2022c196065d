"""DeepSeek-V4 with ESS on, DA and DBA (issue 37 item 2), in process: the CPU dsv4 arm with its C4 entries in
ESS's host store on the worker engine (a real prefetch process, ZMQ, shared host and slot memory), against the
same arm with ESS off on the same inputs, at each overlap level:
  none  land, then one softmax over window + top-k with the sink: bit-identical to ESS off;
  da    the window and the resident entries attended while the misses are in flight (Attn0), then the misses
        (Attn1), merged by log-sum-exp, the sink counted once: within the bound below;
  dba   the same per half batch, each half planned in its own ring group before either attends.
The log of each C4 step shows Attn0 issued before the wait for the misses and Attn1 after it, and that steps
with misses in flight did occur (the hot buffer of 5 entries for a top-3 of up to 47 misses often).

The bound (float32, derived, not observed): both outputs are softmax-weighted sums of K <= window + top-k rows
with |v| <= vmax and logits s = scale * q . k of D terms. A D-term dot product is within gamma_D * scale *
|q| |k| <= gamma_D * S of exact (gamma_D = D u / (1 - D u), u = 2**-24, S = scale * max|q| * max|k|); logit
errors d move the weights by at most 2 d relative, the output by at most 4 d vmax; exp, sums and the final
division round at most (K + 4) u relative each, 2 (K + 4) u vmax on the output; the log-sum-exp merge and the
sink's weight carry a few roundings of exponents of size <= S + log K + 1 + |sink|: 32 u (that) vmax (the
merge bound of tests/integration/_cuda_fake.split_bound, twice). Each of the two outputs is within the first
two terms of the exact value, so their difference within twice that, plus the merge term."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from .test_dsv4_cpu_backend import D, SINK, TOPK, WINDOW, compressor, indexer, make_backend, run_steps  # noqa: E402
from .test_dsv4_ess_store import c4_store, paged_req_to_token  # noqa: E402

pytestmark = pytest.mark.integration
U = 2.0 ** -24


def _bound(off, lid, q):
    """The module's bound for C4 layer `lid` of the batch whose queries are q [T, H, D]."""
    rows = torch.cat([off.rows.table(lid, "swa"), off.rows.table(lid, "c4")])
    vmax = float(rows.abs().max())
    s = 0.25 * float(q.norm(dim=-1).max()) * float(rows.norm(dim=-1).max())
    k = WINDOW + TOPK
    gamma = D * U / (1 - D * U)
    e = s + math.log(k) + 1 + float(SINK.abs().max())      # exponents the merge and the sink's weight round
    return vmax * (2 * (4 * gamma * s + 2 * (k + 4) * U) + 32 * U * e)


@pytest.mark.parametrize("level", ["none", "da", "dba"])
def test_c4_decode_overlap_levels_on_the_worker_engine(level):
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None),
              4: (4, compressor(4, D), indexer(4))}
    req_to_token, pool = paged_req_to_token(3, 300)
    store = c4_store(req_to_token, pool, engine="worker", overlap=level)
    try:
        assert store.mode(2) == level and store.store.engine.name == "worker"
        on, off = make_backend(req_to_token, store), make_backend(req_to_token)
        on.events = []
        worst = []

        def check(gots, new, positions, x, swa, qs):
            got, want = gots
            for lid in (0, 3):                          # window-only and C128 layers never touch the store
                assert torch.equal(got[lid], want[lid]), lid
            for lid in (2, 4):
                if level == "none":
                    assert torch.equal(got[lid], want[lid]), lid
                else:
                    err, bound = float((got[lid] - want[lid]).abs().max()), _bound(off, lid, qs[lid])
                    assert err <= bound, (lid, err, bound)
                    worst.append(err / bound)

        # row 1 has no finished C4 entry at its first decode step (3 tokens): a window-only request between two
        # planned ones (DBA's halves then map 2 of 3 batch rows)
        steps = [({0: 150, 1: 1, 2: 13}, False), ({0: 5, 1: 1, 2: 30}, False)] + [({0: 1, 1: 1, 2: 1}, True)] * 10
        run_steps(layers, [on, off], steps, [0, 1, 2], {0: 0, 1: 0, 2: 0}, check)
        u = store.usage()
        assert all(m > 0 for m in u["misses_per_layer"]), u["misses_per_layer"]
        assert u["engine"] == "worker" and u["overlap_level"] == level
        plans = 10 * 2 * (2 if level == "dba" else 1)       # 10 decode steps x 2 C4 layers (x 2 halves)
        assert u["dual_steps"] + u["single_steps"] == plans and (u["dual_steps"] > 0) == (level != "none"), u

        ev = on.events
        if level == "none":
            assert {e[0] for e in ev} == {"plan", "wait", "attn", "commit"}
            return
        dual = [i for i, e in enumerate(ev) if e[0] == "attn0"]
        assert dual, ev                                 # some steps had misses in flight
        for i in dual:                                  # Attn0, then the wait for the misses, then Attn1
            assert [e[0] for e in ev[i:i + 4]] == ["attn0", "wait", "attn1", "commit"], ev[i:i + 4]
            assert len({e[1:] for e in ev[i:i + 4]}) == 1
        halves = {e[2] for e in ev}
        assert halves == ({0, 1} if level == "dba" else {0}), halves
        if level == "dba":                              # both halves planned (fetches submitted) before either attends
            for i, e in enumerate(ev):
                if e[0] == "plan" and e[2] == 0:
                    assert [x[0] for x in ev[i:i + 2]] == ["plan", "plan"] and ev[i + 1][2] == 1, ev[i:i + 3]
    finally:
        store.shutdown()
