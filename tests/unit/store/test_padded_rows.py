"""Padded batch rows on the device (issue 16: the store's part of decode CUDA graphs). A CUDA graph
replays a batch padded to its captured size, so the store must take rows marked -1 (SGLang's padding)
without a host read and without touching anything for them: the same decode steps, once with the real
rows and once padded with two -1 rows carrying arbitrary positions and top-k (`padded=True`, as a graph
path would call it), leave the same LRU state,
the same hot-slot bytes and counters, and give the real rows the same read slots; the padded rows get
-1 everywhere (no slot reserved, nothing read, nothing fetched)."""
import pytest
import torch

from sgl_ess.kernels.resolver_numba import available as numba_available
from tests.unit.store.helpers import make_store, token_rows

ROW_BYTES, LAYERS = 16, 2
BACKENDS = ["torch"] + (["numba"] if numba_available() else [])


def _stores(hot_groups, resolver):
    out = []
    for _ in range(2):
        st, tab = make_store(layers=LAYERS, row_bytes=ROW_BYTES, n=24, k=8, max_requests=6, ring_slots=16,
                             hot_groups=hot_groups, resolver_backend=resolver)
        for rid, ctx in (("a", 100), ("b", 60)):
            tab.add(rid, ctx)
            for layer in range(LAYERS):
                st.write_host(layer, tab.host_locs(rid), token_rows(tab.host_locs(rid), ROW_BYTES, layer))
        out.append((st, tab))
    return out


@pytest.mark.parametrize("resolver", BACKENDS)
@pytest.mark.parametrize("hot_groups", [0, 4])
def test_padded_rows_change_nothing_and_read_nothing(hot_groups, resolver):
    g = torch.Generator().manual_seed(0)
    (sa, ta), (sb, tb) = _stores(hot_groups, resolver)
    if hot_groups:                 # the last request row owns a hot buffer: a -1 row must not reach it
        for t in (ta, tb):
            t._free_indices.remove(5)
            t._free_indices.append(5)
            assert t.add("c", 30) == 5
    ids = ["a", "b"]
    for step in range(6):
        pos = ta.extend(ids)
        tb.extend(ids)
        reqs, lens = ta.indices(ids), ta.seq_lens(ids)
        topk = torch.stack([torch.cat([pos[i:i + 1], torch.randperm(int(lens[i]) - 1, generator=g)[:7]])
                            for i in range(2)])
        pad_reqs = torch.cat([reqs, torch.tensor([-1, -1])])
        pad_lens = torch.cat([lens, torch.tensor([1, 1])])            # SGLang's seq_len fill value
        pad_topk = torch.cat([topk, torch.randint(0, 50, (2, 8), generator=g)])
        for layer in range(LAYERS):
            newest = token_rows(pos, ROW_BYTES, 100 + layer)
            ra = sa.reserve(layer, reqs, lens - 1, validate=False)
            rb = sb.reserve(layer, pad_reqs, pad_lens - 1, validate=False, padded=True)
            assert torch.equal(ra, rb[:2]) and (rb[2:] == -1).all()
            sa.write_slots(ra, newest)
            sb.write_slots(rb, torch.cat([newest, torch.full((2, ROW_BYTES), 77, dtype=torch.uint8)]), padded=True)
            pa = sa.plan(layer, reqs, lens, topk, ta.req_to_host, validate=False)
            pb = sb.plan(layer, pad_reqs, pad_lens, pad_topk, tb.req_to_host, validate=False, padded=True)
            assert torch.equal(pa.read_slots, pb.read_slots[:2])
            assert (pb.read_slots[2:] == -1).all()
            for s, p in ((sa, pa), (sb, pb)):
                s.land(p)
                s.commit(p)
        assert torch.equal(sa.hot.slot_to_token, sb.hot.slot_to_token)
        assert torch.equal(sa.hot.lru_order, sb.hot.lru_order)
        assert torch.equal(sa.slots.rows[:sa.slots.ring_base], sb.slots.rows[:sb.slots.ring_base])
        ca, cb = sa.counters.snapshot(), sb.counters.snapshot()
        assert ca["layer_misses"] == cb["layer_misses"] and ca["layer_hits"] == cb["layer_hits"]
        assert torch.equal(sa.counters.hits, sb.counters.hits) and torch.equal(sa.counters.misses, sb.counters.misses)
    assert sum(ca["layer_misses"]) > 0
