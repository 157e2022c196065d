"""Issue 32, defect 1 (the store's half, defence in depth): a request row whose forwards bypassed
open() - on an H200, SGLang's dense MHA one-shot prefill of a short prompt never reaches the ESS
extend path - still gets a slot map from the device decode, which does not check that its row is
open (validate=False). Closing that row must empty its hot buffer, as closing an open row does;
else the next request on the row is planned against the first one's slot map and reads its rows."""
import pytest
import torch

from sgl_ess.store.resolver import assign
from tests.unit.store.helpers import make_store, token_rows

ROW_BYTES, LAYERS, N, K = 16, 2, 24, 8


@pytest.mark.parametrize("hot_groups", [0, 4])
def test_closing_a_row_that_was_never_opened_empties_its_hot_buffer(hot_groups):
    g = torch.Generator().manual_seed(3)
    st, tab = make_store(layers=LAYERS, row_bytes=ROW_BYTES, n=N, k=K, max_requests=6, ring_slots=16,
                         hot_groups=hot_groups)
    fresh, _ = make_store(layers=LAYERS, row_bytes=ROW_BYTES, n=N, k=K, max_requests=6, ring_slots=16,
                          hot_groups=hot_groups)
    req = tab.add("a", 80)
    group = int(st.groups_of(torch.tensor([req]))[0])
    if hot_groups:
        # an indirect hot buffer belongs to the row only while it is open: the decode below reads
        # the row's buffer through group_of, so keep it mapped and only drop the open flag
        st.hot.is_open[group] = False
    else:
        st.close(req)                      # the row is not open: as if its prefill never opened it
    assert not st.is_open(req)
    for layer in range(LAYERS):
        st.write_host(layer, tab.host_locs("a"), token_rows(tab.host_locs("a"), ROW_BYTES, layer))
    reqs = torch.tensor([req])
    for step in range(3):                  # the device decode: no open check (validate=False)
        lens = torch.tensor([80])
        topk = torch.randperm(80, generator=g)[:K].reshape(1, K)
        for layer in range(LAYERS):
            plan = st.plan(layer, reqs, lens, topk, tab.req_to_host, validate=False)
            st.land(plan)
            st.commit(plan)
    assert (st.hot.slot_to_token[:, group] >= 0).any(), "the decode should have filled the row's slot map"
    tab.release("a")                       # finish: close() on a row that is not open
    assert torch.equal(st.hot.slot_to_token[:, group], fresh.hot.slot_to_token[:, group]), \
        "a closed row kept its slot map: the next request on it reads these rows"
    assert torch.equal(st.hot.lru_order[:, group], fresh.hot.lru_order[:, group])
    # its hot slots' bytes are left (closing a row that is not open stays cheap: a PD decode node closes
    # every row it allocates), but unreachable: the next request on this hot buffer selecting the very
    # same tokens finds no hit (a hot slot's bytes are read only on a hit), every entry is fetched
    for layer in range(LAYERS):
        a = assign(st.hot, layer, torch.tensor([group]), torch.tensor([80]), topk, backend=st.resolver_backend)
        assert not a.hit.any(), f"layer {layer}: the next request on the row hits the closed row's hot slots"
