"""A warm state moved between stores (a PD prefill node's hot buffer -> the decode node's): the
receiving store, warmed from `lru_tokens` only, makes the same hits, misses and evictions on every
later step as the sender does, and serves the right bytes, though its request index and host
locations differ. Malformed states are refused and leave the request cold."""
import torch

from tests.unit.store.helpers import locality_trace, make_store, token_rows

N, K, LAYERS = 24, 8, 2


def _store_with(rid, ctx, dummies=0, hot_groups=0):
    """`hot_groups`: fewer hot buffers than the 8 request rows, the rows taken in a scattered order
    (a PD decode node: its row does not own the buffer of the same index)."""
    store, table = make_store(n=N, k=K, layers=LAYERS, hot_groups=hot_groups)
    if hot_groups:
        table._free_indices = [1, 4, 0, 2, 6, 3, 7, 5]
    for i in range(dummies):                    # the decode node's row and host locations differ
        table.add(f"other{i}", 7)
    table.add(rid, ctx)
    for layer in range(LAYERS):
        locs = table.host_locs(rid)
        store.write_host(layer, locs, token_rows(torch.arange(ctx), 16, salt=layer))
    return store, table


def _steps(store, table, rid, trace, grow_rows):
    """Decode steps: each layer resolves the step's top-k; returns per-step misses and the bytes read."""
    out = []
    for step, (seq_len, topk) in enumerate(trace):
        if grow_rows and step:
            pos = table.extend([rid])
            for layer in range(LAYERS):
                store.write_host(layer, table.req_to_host[table.index(rid), pos],
                                 token_rows(pos.cpu(), 16, salt=layer))
        before = sum(store.counters.snapshot()["layer_misses"])
        reads = []
        for layer in range(LAYERS):
            rows = store.resolve(layer, table.indices([rid]), table.seq_lens([rid]), topk[None].to(torch.int32),
                                 table.req_to_host)
            live = rows[0] >= 0
            reads.append(store.slot_rows[rows[0][live].long()])
        out.append((sum(store.counters.snapshot()["layer_misses"]) - before, torch.cat(reads),
                    store.lru_tokens(table.index(rid))))
    return out


def _case(ctx, seed, grow, fast, receiver_groups=0):
    g = torch.Generator().manual_seed(seed)
    trace = list(locality_trace(g, ctx, K, 36, 0.6, grow=grow))   # the prefill's last W queries, then decode
    warm_trace, decode_trace = [t for _, t in trace[:6]], trace[6:]
    ctx = decode_trace[0][0]                       # the prompt: the warm queries' context and more
    assert (ctx <= N) == fast
    sender, st = _store_with("r", ctx)
    receiver, rt = _store_with("r", ctx, dummies=3, hot_groups=receiver_groups)
    warm = torch.stack(warm_trace)[None]           # [1, W, k]
    for layer in range(LAYERS):
        sender.warmup(layer, st.indices(["r"]), st.seq_lens(["r"]), warm, st.req_to_host)
    wire = sender.lru_tokens(st.index("r"))
    fetched = receiver.warm_from_lru_tokens(rt.index("r"), ctx, wire, rt.req_to_host)
    assert fetched == sum(sender.counters.snapshot()["warmup_rows"])
    a = _steps(sender, st, "r", decode_trace, grow)
    b = _steps(receiver, rt, "r", decode_trace, grow)
    assert [m for m, _, _ in a] == [m for m, _, _ in b]
    for (_, ra, la), (_, rb, lb) in zip(a, b):
        assert torch.equal(ra, rb)                # the same bytes read
        assert torch.equal(la, lb)                # the same LRU state after every step
    assert sender.counters.snapshot()["layer_misses"] == receiver.counters.snapshot()["layer_misses"]
    return a


def test_a_long_request_warmed_from_the_wire_behaves_as_the_sender():
    steps = _case(ctx=300, seed=1, grow=True, fast=False)
    assert sum(m for m, _, _ in steps) > 0           # the trace evicts and misses: order matters


def test_a_decode_node_with_fewer_hot_buffers_than_rows_behaves_as_the_sender():
    """Issue 18: the receiving row (7) holds hot buffer 3 of 4."""
    steps = _case(ctx=300, seed=3, grow=True, fast=False, receiver_groups=4)
    assert sum(m for m, _, _ in steps) > 0


def test_a_fast_row_that_grows_past_the_hot_buffer_behaves_as_the_sender():
    steps = _case(ctx=N - 12, seed=2, grow=True, fast=True)  # starts at N - 6 tokens: slot = position until it outgrows N
    assert sum(m for m, _, _ in steps) > 0


def test_malformed_states_are_refused_and_leave_the_request_cold():
    receiver, rt = _store_with("r", 100)
    row = rt.index("r")
    good = torch.full((LAYERS, N), -1, dtype=torch.int64)
    good[:, -3:] = torch.tensor([5, 9, 2])
    bad = {
        "position past seq_len": good.clone().index_fill_(1, torch.tensor([N - 1]), 100),
        "token held twice": good.clone().index_fill_(1, torch.tensor([N - 2]), 2),
        "wrong width": good[:, :-1],
        "wrong layer count": good[:1],
    }
    for what, t in bad.items():
        assert receiver.warm_from_lru_tokens(row, 100, t, rt.req_to_host) is None, what
    assert int((receiver.hot.slot_to_token[:, row] >= 0).sum()) == 0
    fast, ft = _store_with("f", 10)
    holes = torch.full((LAYERS, N), -1, dtype=torch.int64)
    holes[:, -2:] = torch.tensor([3, 4])          # a fast row holds its whole context, not two tokens
    assert fast.warm_from_lru_tokens(ft.index("f"), 10, holes, ft.req_to_host) is None
    assert receiver.warm_from_lru_tokens(row, 100, good, rt.req_to_host) == 3 * LAYERS
