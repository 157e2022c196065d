"""Hunyuan V4's learnable attention sinks in the ESS attention paths, against
sgl_ess.attention.sink_reference (written from the model's definition: the per-head sink logit in the
softmax denominator, no value). Each path is also run with the sink dropped (or counted twice, for DA's
merge), and that run must differ from the reference: the checks can fail.

Paths: the reference itself (against a second formulation: an extra key scored sink_h with a zero
value); reference.with_sink (the CPU attention); every overlap level of the store's decode (none / DA /
DBA, overlap.SinkAttend: partial attentions without the sink, added once after the merge); the ``ess``
backend's kernels (prefill, MTP verify's gathered rows, the slot space) and its reading of the sinks from
the model. Compared with torch's default tolerances for the precision each path computes in (float64; the
store's decode: float32)."""
import pytest
import torch

from sgl_ess.attention.overlap import SinkAttend, decode_layer, plan_layer
from sgl_ess.attention.reference import attend, sparse_mla_decode, with_sink
from sgl_ess.attention.sink_reference import sink_attention
from sgl_ess.kernels.latent_layout import LatentLayout
from tests.unit.store.helpers import make_store

LAY = LatentLayout("fp32", 32, 8)
SCALE = 0.15
H = 4


def _close(a, b, dtype=torch.float64):
    """Equal within torch's default tolerances for `dtype` (the precision the path computes in)."""
    torch.testing.assert_close(a.to(dtype), b.to(dtype))


def _differs(a, b, dtype=torch.float64):
    try:
        _close(a, b, dtype)
    except AssertionError:
        return True
    return False


def _case(seed, t=3, k=12):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, H, LAY.dim, generator=g, dtype=torch.float64)
    kv = torch.randn(t, k, LAY.dim, generator=g, dtype=torch.float64)
    keep = torch.rand(t, k, generator=g) < 0.7
    keep[0, 0] = True
    keep[-1] = False                                    # a query that selected nothing
    sink = torch.randn(H, generator=g, dtype=torch.float64) + 1.0
    return q, kv, keep, sink


def test_reference_equals_softmax_with_an_extra_zero_valued_key():
    q, kv, keep, sink = _case(0)
    t, h, d = q.shape
    # the sink as one more key: an extra query column scores it sink_h, its value columns are 0
    q_aug = torch.cat([q, (sink / SCALE).view(1, h, 1).expand(t, h, 1)], dim=2)
    kv_aug = torch.cat([torch.cat([kv, torch.zeros(t, kv.shape[1], 1, dtype=kv.dtype)], 2),
                        torch.eye(d + 1, dtype=kv.dtype)[d].view(1, 1, d + 1).expand(t, 1, d + 1)], dim=1)
    keep_aug = torch.cat([keep, keep.any(dim=1, keepdim=True)], dim=1)
    want = torch.zeros(t, h, LAY.kv_lora_rank, dtype=torch.float64)
    for i in range(t):
        for j in range(h):
            s = (kv_aug[i][keep_aug[i]] @ q_aug[i, j]) * SCALE
            if s.numel():
                want[i, j] = torch.softmax(s, 0) @ kv_aug[i][keep_aug[i]][:, :LAY.kv_lora_rank]
    _close(sink_attention(q, kv, keep, sink, LAY.kv_lora_rank, SCALE), want)
    # a sink of -inf is no sink: plain attention
    plain, _ = attend(q, kv, keep, LAY.kv_lora_rank, SCALE, torch.float64)
    _close(sink_attention(q, kv, keep, torch.full((H,), float("-inf"), dtype=torch.float64), LAY.kv_lora_rank,
                          SCALE), plain)


def test_with_sink_after_attention_is_the_reference_and_dropping_it_is_not():
    q, kv, keep, sink = _case(1)
    want = sink_attention(q, kv, keep, sink, LAY.kv_lora_rank, SCALE)
    out, lse = attend(q, kv, keep, LAY.kv_lora_rank, SCALE, torch.float64)
    got, lse2 = with_sink(out, lse, sink)
    _close(got, want)
    assert bool((got[-1] == 0).all()) and bool(torch.isneginf(lse2[-1]).all()), "nothing selected: out 0"
    assert _differs(out, want), "the sink changes nothing here: the check could not fail"


def _attend(q, rows, slots):
    return sparse_mla_decode(q, rows, slots, LAY, SCALE)


class _SinkTwice:
    """The defect the merge guards against: the sink counted in each partial attention."""

    def __init__(self, sink):
        self.sink = sink

    def __call__(self, q, rows, slots):
        out, lse = _attend(q, rows, slots)
        return with_sink(out, lse, self.sink)


@pytest.mark.parametrize("mode", ["none", "da", "dba"])
def test_every_overlap_level_adds_the_sink_once(mode):
    """The store's decode at each level (DA/DBA: two partial attentions merged by log-sum-exp) with a
    SinkAttend equals the reference over each request's full top-k; the same run with the sink dropped,
    or counted in each part, does not."""
    layers, k, n = 1, 16, 24
    contexts = [200, 90, 150, 60]
    g = torch.Generator().manual_seed(3)
    sink = torch.randn(H, generator=g) + 1.0
    runs = {}
    for variant in ("sink", "dropped", "twice"):
        store, table = make_store(layers=layers, row_bytes=LAY.row_bytes, host_tokens=sum(contexts) + 64, n=n,
                                  max_requests=4, k=k, max_context=1024)
        gen = torch.Generator().manual_seed(4)
        ids = [f"r{i}" for i in range(len(contexts))]
        full = {}
        for rid, ctx in zip(ids, contexts):
            table.add(rid, ctx)
            full[rid] = torch.randn(ctx + 4, LAY.dim, generator=gen)
            store.write_host(0, table.host_locs(rid), LAY.encode(full[rid][:ctx]))
        outs, refs = [], []
        for _ in range(3):
            pos = table.extend(ids)
            reqs, lens = table.indices(ids), table.seq_lens(ids)
            q = torch.randn(len(ids), H, LAY.dim, generator=gen)
            new = torch.stack([full[rid][int(pos[i])] for i, rid in enumerate(ids)])
            store.append(0, reqs, pos, LAY.encode(new), table.req_to_host)
            topk = torch.stack([torch.cat([pos[i:i + 1], torch.randperm(int(lens[i]) - 1, generator=gen)[:k - 1]])
                                for i in range(len(ids))])
            steps = plan_layer(store, mode, 0, reqs, lens, topk, table.req_to_host)
            attend_fn = {"sink": SinkAttend(_attend, sink), "dropped": _attend, "twice": _SinkTwice(sink)}[variant]
            outs.append(decode_layer(store, mode, q, steps, attend_fn))
            kv = torch.stack([full[rid][topk[i]] for i, rid in enumerate(ids)])
            refs.append(sink_attention(q, kv, torch.ones(topk.shape, dtype=torch.bool), sink, LAY.kv_lora_rank,
                                       SCALE))
        assert sum(store.counters.snapshot()["layer_misses"]) > 0, "no misses: DA had nothing to split"
        for rid in ids:
            table.release(rid)
        store.engine.drain()
        store.shutdown()
        runs[variant] = (torch.cat(outs), torch.cat(refs))
    f32 = torch.float32          # the store's attention (reference.sparse_mla_decode) accumulates in fp32
    _close(*runs["sink"], dtype=f32)
    assert _differs(*runs["dropped"], dtype=f32), "dropping the sink matches the reference: the check could not fail"
    if mode != "none":     # one attention per step at level none: once and 'each part' are the same
        assert _differs(*runs["twice"], dtype=f32), "a sink in both DA parts matches the reference"


def test_a_sink_needs_the_kernels_lse():
    """A kernel that returns no log-sum-exp (FlashMLA through SGLang's wrapper) cannot have the sink added
    after a merge: it must take it itself (store_forward.attend_slots); SinkAttend over it raises."""
    from types import SimpleNamespace

    from sgl_ess.attention.overlap import attend_step

    store = SimpleNamespace(slot_rows=None, land=lambda s: None, commit=lambda s: None)
    step = SimpleNamespace(landed=True, read_slots=None)
    with pytest.raises(RuntimeError, match="log-sum-exp"):
        attend_step(store, step, None, SinkAttend(lambda q, r, s: (torch.zeros(1), None), torch.zeros(H)), dual=False)
