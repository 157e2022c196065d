"""A steady prefill layer of StoreForward.extend reads nothing back from the device itself (issue 35 / 32):
the request rows' host list and the per-token request rows are built once per forward batch (layer 0) and
reused, and repeat_interleave gets its output size from the host. bench/op_count.count_extend_syncs counts
layer 1 of such a forward; no site in store_forward.py may remain (2 there before, of 3 in all:
repeat_interleave's size read-back and reqs.tolist() every layer)."""
from bench.op_count import count_extend_syncs


def test_a_steady_extend_layer_has_no_sync_in_store_forward():
    got = count_extend_syncs()
    mine = {site: n for site, n in got["sync_sites"].items() if "store_forward.py" in site}
    assert not mine, mine
