from collections import OrderedDict

import numpy as np

from sgl_ess.sim.hitrate import _top_c_mask, layer_misses, layer_similarity, misses_per_layer


def test_top_c_mask_equals_python_lru_oracle():
    rng = np.random.default_rng(0)
    n, cap = 200, 40
    last = np.full(n, -1, dtype=np.int64)
    oracle: OrderedDict[int, None] = OrderedDict()
    clock = 0
    for _ in range(60):
        ids = rng.choice(n, size=int(rng.integers(1, 30)), replace=False)
        resident = _top_c_mask(last, cap)
        assert set(np.flatnonzero(resident)) == set(oracle)
        for i in ids:                       # same access order as the simulator's touch()
            oracle.pop(int(i), None)
            oracle[int(i)] = None
            while len(oracle) > cap:
                oracle.popitem(last=False)
        last[ids] = clock + np.arange(ids.size)
        clock += ids.size


def test_no_offload_means_no_misses():
    assert misses_per_layer(62, 32768, 2048, 1.0, 2, True, 1000).sum() == 0


def test_cold_start_without_warmup_is_about_1700_of_2048():
    lm = layer_misses(0.5, 32768, 2048, 0.2, 1, warmup=False)
    assert 1400 <= lm.first_step_misses <= 1900
    warm = layer_misses(0.5, 32768, 2048, 0.2, 1, warmup=True)
    assert warm.first_step_misses < 0.25 * lm.first_step_misses


def test_profile_shape_and_magnitude_at_r02_32k():
    sim = layer_similarity(61)
    assert sim[0] < 0.1 and sim[1:18].min() >= 0.7 and sim[18:45].max() <= 0.6
    m = misses_per_layer(62, 32768, 2048, 0.21, 2, True, 1e9)
    assert m[0] == m.max()                          # layer 0 has ~no locality
    assert m[18:45].mean() > m[1:18].mean() and m[18:45].mean() > m[48:61].mean()
    assert 10 < np.median(m[:61]) < 400             # "tens to a few hundred" (ESS.md section 3)


def test_misses_fall_as_ratio_grows():
    means = [misses_per_layer(62, 32768, 2048, r, 2, True, 1e9).mean() for r in (0.1, 0.21, 0.5)]
    assert means[0] > means[1] > means[2]


def test_hit_rate_override():
    m = misses_per_layer(62, 32768, 2048, 0.21, 1, True, 1e9, hit_rate=0.9)
    assert np.allclose(m, 0.1 * 2048, rtol=0.02)
