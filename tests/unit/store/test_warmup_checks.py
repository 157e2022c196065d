"""LatentStore.warmup without host syncs (issue 32 item 7: a prefill layer ran 5 of its 7 device -> host syncs
here). With a device-stream engine the warm rows are one static-shape move (-1 where a slot is empty, no
boolean selection, no row count read back) and the input checks are one folded device boolean: read once
on the CPU (then the clear error of the check that failed), a device-side assert on CUDA, nothing with
validate=False. Compared with the inline engine's warmup on the same inputs: the same LRU state, rows and
counts."""
import pytest
import torch

from sgl_ess.prefetch.stream_engine import StreamEngine
from tests.stream_doubles import LateStreams
from tests.unit.store.helpers import locality_trace, make_store, token_rows

SYNCS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}


def _setup(engine: str, seed: int = 0, reqs: int = 3, n: int = 48, k: int = 16):
    store, table = make_store(n=n, k=k, layers=2)
    if engine == "stream":
        store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=LateStreams(seed),
                                    zero_backend="torch")
    ids = [f"r{i}" for i in range(reqs)]
    g = torch.Generator().manual_seed(seed)
    warm = []
    for i, rid in enumerate(ids):
        ctx = 30 if i == 0 else 500           # request 0 fits in N: the fast path (its whole context)
        table.add(rid, ctx)
        for layer in range(2):
            locs = table.host_locs(rid)
            store.write_host(layer, locs, token_rows(locs, 16, salt=layer))
        warm.append(torch.stack([t for _, t in locality_trace(g, ctx, k, 8, 0.6, grow=False)]))
    for rid in ids:
        store.open(table.index(rid))
    return store, table, ids, torch.stack(warm)


def _syncs(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = fn()
    return out, sum(e.name in SYNCS for e in prof.events())


@pytest.mark.parametrize("validate, reads", [(True, 1), (False, 0)])
def test_stream_warmup_reads_the_device_only_for_its_checks_and_equals_inline(validate, reads):
    inline, it, ids, warm = _setup("inline")
    stream, st, _, _ = _setup("stream")
    for layer in range(2):
        want = inline.warmup(layer, it.indices(ids), it.seq_lens(ids), warm, it.req_to_host)
        got, n = _syncs(lambda: stream.warmup(layer, st.indices(ids), st.seq_lens(ids), warm, st.req_to_host,
                                              validate=validate))
        assert n == reads
        assert isinstance(got, torch.Tensor) and got.dim() == 0 and int(got) == int(want) > 0
    stream.engine.drain()
    inline.engine.drain()
    assert torch.equal(stream.hot.slot_to_token, inline.hot.slot_to_token)
    assert torch.equal(stream.hot.lru_order, inline.hot.lru_order)
    assert torch.equal(stream.slot_rows, inline.slot_rows)          # the same rows landed in the same slots
    assert torch.equal(stream.counters.warmup_rows, inline.counters.warmup_rows)
    assert torch.equal(stream.counters.rows_h2d, inline.counters.rows_h2d)


@pytest.mark.parametrize("engine", ["inline", "stream"])
@pytest.mark.parametrize("fault, error, needle", [
    ("closed", KeyError, "no open hot buffer"),
    ("out_of_range", KeyError, "out of range"),
    ("repeated", ValueError, "repeat"),
    ("past_context", IndexError, "selects position"),
    ("below_padding", IndexError, "negative"),
])
def test_a_bad_warmup_names_its_fault_on_the_cpu(engine, fault, error, needle):
    store, table, ids, warm = _setup(engine)
    reqs, lens = table.indices(ids), table.seq_lens(ids)
    if fault == "closed":
        store.close(int(reqs[1]))
    elif fault == "out_of_range":
        reqs = reqs.clone()
        reqs[2] = store.cfg.max_requests
    elif fault == "repeated":
        reqs = reqs.clone()
        reqs[2] = reqs[0]
    elif fault == "past_context":
        warm = warm.clone()
        warm[1, 3, 0] = int(lens[1])
    else:
        warm = warm.clone()
        warm[2, 0, 5] = -2
    with pytest.raises(error, match=needle):
        store.warmup(0, reqs, lens, warm, table.req_to_host)
