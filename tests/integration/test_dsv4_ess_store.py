"""ESS on for DeepSeek-V4's C4 layers, in process (dsv4/c4_store.py through dsv4/cpu_backend.py): the CPU dsv4
arm with its C4 entries in ESS's host store (LatentStore, one row per entry) and each decode step's top-k read
through a per-request hot buffer of 5 entries (top-3 of up to 47: the exact LRU evicts and misses are fetched),
warm-started from the extend's last query positions, against the same arm with ESS off on the same inputs:
every layer's output is bit-identical (the same float32 entries gathered in the same top-k order), misses and
fetched rows are counted, a closed request leaves no host row, hot slot or open buffer, its host rows read
zero, and reused request rows (closed, or reopened by an extend from position 0) serve again identically.
The first test runs small float32 rows; the second V4's 512-channel entries in SGLang's 584-byte FP8 row
(attention/dsv4_kv_rows.py), ESS off rounding its rows the same way."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from sgl_ess.integration.sglang.dsv4.c4_store import C4EntryStore  # noqa: E402

from .test_dsv4_cpu_backend import D, G, TOPK, compressor, indexer, make_backend, run_steps  # noqa: E402

pytestmark = pytest.mark.integration
HOT = 5
PAGE = 8                 # token locations come in pages (SGLang's V4: 256), so a C4 block's 4 are an aligned group


def paged_req_to_token(rows: int, width: int) -> tuple[torch.Tensor, int]:
    """(req_to_token int64 [rows, width], pool tokens): each row's positions in pages of PAGE locations, the
    pages scattered over the pool in a random order, page 0 left out (SGLang's padding page)."""
    per_row = -(-width // PAGE)
    pages = torch.randperm(rows * per_row, generator=G) + 1
    pos = torch.arange(width)
    r2t = torch.stack([pages[r * per_row + pos // PAGE] * PAGE + pos % PAGE for r in range(rows)])
    return r2t, (rows * per_row + 1) * PAGE


def c4_store(req_to_token, pool, d=D, **kw):
    return C4EntryStore([2, 4] if d == D else [2], d, TOPK, req_to_token, pool, HOT, warmup_queries=2,
                        **{"fp8_rows": d != D, **kw})


def _equal(gots, *_):
    on, off = gots
    for lid in off:
        assert torch.equal(on[lid], off[lid]), lid


def test_c4_entries_through_host_store_equal_ess_off():
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None),
              4: (4, compressor(4, D), indexer(4))}
    req_to_token, pool = paged_req_to_token(3, 300)
    store = c4_store(req_to_token, pool)
    on, off = make_backend(req_to_token, store), make_backend(req_to_token)
    steps = [({0: 150, 1: 13}, False), ({0: 5, 1: 30}, False)] + [({0: 1, 1: 1}, True)] * 10
    run_steps(layers, [on, off], steps, [0, 1], {0: 0, 1: 0}, _equal)
    u = store.usage()
    assert u["hot_requests_open"] == 2 and u["host_tokens_live"] == (165 // 4) + (53 // 4)
    assert u["warmup_rows"] > 0
    misses = u["misses_per_layer"]
    assert all(m > 0 for m in misses), misses            # 5 slots for top-3 of 41 / 13 entries: the LRU evicts
    assert u["rows_h2d"] >= sum(misses) and sum(u["hits_per_layer"]) > 0

    # SGLang frees request row 0 and its pages (no radix cache): the hot buffer closes, the entries at its
    # pages' C4 locations are zeroed
    rows0 = store.req_to_host[0, :165 // 4].clone()
    store.close_rows([0])
    store.clear_locs(req_to_token[0, :165])
    assert store.usage()["host_tokens_live"] == 53 // 4 and store.usage()["hot_requests_open"] == 1
    assert not store.store.host.rows[:, rows0].any()     # its host rows were zeroed
    # row 0 reused after its close, row 1 reused without one (an extend from position 0 reopens it)
    steps = [({0: 70, 1: 90}, False)] + [({0: 1, 1: 1}, True)] * 6
    run_steps(layers, [on, off], steps, [0, 1], {0: 0, 1: 0}, _equal)
    assert store.opens == 4
    store.close_rows([0, 1])
    store.clear_locs(req_to_token[:2].reshape(-1))
    u = store.usage()
    assert u["host_tokens_live"] == 0 and u["hot_slots_used"] == 0 and u["hot_requests_open"] == 0
    assert not store.store.host.rows.any()
    store.shutdown()


def test_fp8_rows_on_host_equal_ess_off():
    """V4's layout: host rows of 584 bytes, decoded = ESS off's rounded entries; every output bit-identical.
    With ESS on keeping unrounded entries (or ESS off not rounding) the outputs differ."""
    from sgl_ess.attention.dsv4_kv_rows import ROW_BYTES, dequantize_rows

    d = 512
    layers = {0: (0, None, None), 2: (4, compressor(4, d), indexer(2)), 3: (128, compressor(128, d), None)}
    req_to_token, pool = paged_req_to_token(2, 300)
    store = c4_store(req_to_token, pool, d)
    assert store.cfg.row_bytes == ROW_BYTES == 584
    on, off = make_backend(req_to_token, store, fp8_rows=True), make_backend(req_to_token, fp8_rows=True)
    # the same arm whose host store keeps the C4 entries as float32: only the C4 layer's output may differ
    raw = make_backend(req_to_token, c4_store(req_to_token, pool, d, fp8_rows=False), fp8_rows=True)
    differs = []

    def check(gots, *_):
        _equal(gots[:2])
        assert torch.equal(gots[2][0], gots[1][0]) and torch.equal(gots[2][3], gots[1][3])
        differs.append(not torch.equal(gots[2][2], gots[1][2]))

    steps = [({0: 150, 1: 13}, False)] + [({0: 1, 1: 1}, True)] * 6
    run_steps(layers, [on, off, raw], steps, [0, 1], {0: 0, 1: 0}, check, d=d)
    assert all(differs), differs                         # float32 entries are not the V4 pool's
    n = int(store.known[0])
    assert torch.equal(store.req_to_host[0, :n], req_to_token[0, torch.arange(n) * 4 + 3] // 4)   # C4 locations
    host = store.store.host.rows[0][store.req_to_host[0, :n]]
    want = off.rows.read(2, "c4", req_to_token[0, torch.arange(n) * 4 + 3])
    assert host.shape == (n, 584) and torch.equal(dequantize_rows(host), want)
    assert store.usage()["misses_per_layer"][0] > 0
    store.close_rows([0, 1])
    store.clear_locs(req_to_token.reshape(-1))
    assert not store.store.host.rows.any() and store.usage()["hot_requests_open"] == 0
    store.shutdown()
    raw.ess.shutdown()


def test_a_cached_prefix_reads_the_entries_its_first_request_wrote():
    """SGLang's radix cache: request row 1 starts after a 96-token prefix cached by request row 0 (its
    req_to_token holds row 0's locations there), on a row that row 0's close left; the prefix's 24 entries
    per C4 layer are found on host, not recomputed, and ESS on still equals ESS off. Evicting the prefix's
    pages zeroes its entries; a request that then claims that prefix is refused."""
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None),
              4: (4, compressor(4, D), indexer(4))}
    req_to_token, pool = paged_req_to_token(3, 300)
    prefix = 96
    req_to_token[1, :prefix] = req_to_token[0, :prefix]            # the radix cache's match
    store = c4_store(req_to_token, pool)
    on, off = make_backend(req_to_token, store), make_backend(req_to_token)
    run_steps(layers, [on, off], [({0: 130}, False)] + [({0: 1}, True)] * 3, [0], {0: 0}, _equal)
    store.close_rows([0])                                          # finished; its pages stay in the cache
    u = store.usage()
    assert (u["host_tokens_used"], u["host_tokens_live"], u["host_tokens_cached"]) == (133 // 4, 0, 133 // 4)
    run_steps(layers, [on, off], [({1: 40}, False)] + [({1: 1}, True)] * 4, [1], {1: prefix}, _equal)
    u = store.usage()
    assert u["reused_entries"] == prefix // 4 and store.opens == 2
    assert u["host_tokens_used"] == 133 // 4 + (prefix + 44) // 4 - prefix // 4
    assert u["host_tokens_live"] == (prefix + 44) // 4                  # row 1's, its prefix's included
    assert torch.equal(store.req_to_host[1, :prefix // 4], store.c4_locations(0, 0, prefix // 4))
    store.close_rows([1])
    store.clear_locs(req_to_token[:2].reshape(-1))                 # evicted: every page freed
    assert store.usage()["host_tokens_used"] == 0 and not store.store.host.rows.any()
    with pytest.raises(RuntimeError, match="not on host"):
        req_to_token[2, :prefix] = req_to_token[0, :prefix]
        store.begin_extend(2, prefix)
    store.shutdown()


def test_tokens_moved_by_the_radix_cache_are_followed():
    """SGLang's radix cache deduplicates a running request's prefix: after row 1 prefilled the same 96 tokens as
    row 0, its checkpoint re-points req_to_token[1, :96] at row 0's pages and frees its own (radix_cache.py,
    _insert_cache), whose entries the page hook zeroes; row 2 then gets those pages and writes its own entries
    there. Decoding rows 0, 1, 2 afterwards equals ESS off, which reads by location: row 1's table follows
    req_to_token (refresh) instead of reading zeroed rows or row 2's entries."""
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None),
              4: (4, compressor(4, D), indexer(4))}
    req_to_token, pool = paged_req_to_token(3, 300)
    store = c4_store(req_to_token, pool)
    on, off = make_backend(req_to_token, store), make_backend(req_to_token)
    seen = []

    def record(t):                                   # row 0's prompt, kept to give row 1 the same one
        x, swa, qs = torch.randn(t, 12, generator=G), {lid: torch.randn(t, D, generator=G) for lid in layers}, \
            {lid: torch.randn(t, 2, D, generator=G) for lid in layers}
        seen.append((x, swa, qs))
        return x, swa, qs

    run_steps(layers, [on, off], [({0: 96}, False)], [0], {0: 0}, _equal, inputs=record)
    run_steps(layers, [on, off], [({1: 96}, False)], [1], {1: 0}, _equal, inputs=lambda t: seen[0])
    old = req_to_token[1, :96].clone()
    store.clear_locs(old)                            # the duplicate pages freed ...
    req_to_token[1, :96] = req_to_token[0, :96]      # ... and the row re-pointed at the cached ones
    req_to_token[2, :96] = old                       # row 2 gets the freed pages
    run_steps(layers, [on, off], [({2: 96}, False)], [2], {2: 0}, _equal)
    run_steps(layers, [on, off], [({0: 1, 1: 1, 2: 1}, True)] * 6, [0, 1, 2], {0: 96, 1: 96, 2: 96}, _equal)
    assert torch.equal(store.req_to_host[1, :24], store.req_to_host[0, :24])
    u = store.usage()
    # 102 tokens each: 25 entries; row 1 shares row 0's first 24 and has one of its own
    assert u["host_tokens_live"] == u["host_tokens_used"] == 25 + 1 + 25, u
    store.shutdown()


def test_hot_buffer_smaller_than_topk_is_refused():
    with pytest.raises(ValueError, match="needs >= 4"):
        C4EntryStore([2], D, TOPK, torch.zeros(2, 64, dtype=torch.int64), 128, TOPK, fp8_rows=False)


def test_ess_on_refuses_what_the_slice_does_not_implement():
    import types

    from sgl_ess.config import EssConfig
    from sgl_ess.integration.sglang.dsv4.ess_setup import refusals

    args = dict(speculative_algorithm=None, disaggregation_mode="null", tp_size=1, dp_size=1, pp_size=1,
                enable_torch_compile=False, disable_radix_cache=False)
    runner = types.SimpleNamespace(device="cpu", server_args=types.SimpleNamespace(**args))
    assert refusals(runner, EssConfig(enabled=True)) == []
    for key, value, named in (("speculative_algorithm", "NGRAM", "EAGLE / NEXTN"),
                              ("disaggregation_mode", "decode", "PD"), ("tp_size", 2, "--tp-size 2")):
        runner.server_args = types.SimpleNamespace(**{**args, key: value})
        got = refusals(runner, EssConfig(enabled=True))
        assert len(got) == 1 and named in got[0], got
    # MTP with chain drafts runs; a draft tree is refused
    runner.server_args = types.SimpleNamespace(**{**args, "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1})
    assert refusals(runner, EssConfig(enabled=True)) == []
    runner.server_args = types.SimpleNamespace(**{**args, "speculative_algorithm": "EAGLE", "speculative_eagle_topk": 4})
    got = refusals(runner, EssConfig(enabled=True))
    assert len(got) == 1 and "--speculative-eagle-topk 4" in got[0], got
    runner.server_args = types.SimpleNamespace(**args)
    assert refusals(runner, EssConfig(enabled=True, prefetch_engine="worker")) == []
    assert "inline or worker" in refusals(runner, EssConfig(enabled=True, prefetch_engine="stream"))[0]
