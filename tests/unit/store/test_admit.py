"""The newest row of a step goes straight into a hot slot: the step that selects it hits."""
import torch

from sgl_ess.core.lru_oracle import LruOracle
from tests.unit.store.helpers import make_store, token_rows


def test_admitted_newest_row_is_a_hit_with_the_right_bytes():
    store, table = make_store(layers=1, n=20, k=8)
    table.add("a", 100)
    locs = table.host_locs("a")
    store.write_host(0, locs, token_rows(locs, 16))
    oracle = LruOracle(20)
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        pos = table.extend(["a"])
        loc = table.req_to_host[table.index("a"), pos]
        new = token_rows(loc, 16, salt=3)
        store.write_host(0, loc, new)                      # the engine's own write-back
        store.admit(0, table.indices(["a"]), pos, new)
        oracle.access([int(pos)])
        n = table.seq_len("a")
        topk = torch.cat([pos, torch.randperm(n - 1, generator=g)[:7]]).reshape(1, 8)
        before = sum(store.counters.snapshot()["layer_misses"])
        slots = store.resolve(0, table.indices(["a"]), table.seq_lens(["a"]), topk.to(torch.int32), table.req_to_host)
        want = oracle.access(topk[0].tolist())
        assert int(pos) not in want.misses                 # the newest row is resident
        assert sum(store.counters.snapshot()["layer_misses"]) - before == len(want.misses)
        assert torch.equal(store.slot_rows[slots[0, 0].long()], new[0])
        s2t = store.hot.slot_to_token[0, table.index("a")]
        assert set(s2t[s2t >= 0].tolist()) == oracle.resident()
