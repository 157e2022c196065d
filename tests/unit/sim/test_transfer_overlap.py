import pytest

from sgl_ess.sim.config import EssConfig
from sgl_ess.sim.constants import overridden
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.overlap import LayerPhaseTimes, overlap
from sgl_ess.sim.transfer import GIB, d2h_bytes_per_s, h2d_bytes_per_s, transfer_us


def test_flashtrans_rate_reproduces_paper_675us():
    rate = h2d_bytes_per_s(EssConfig(), get_hardware("h200"))
    assert rate == 37 * GIB
    assert transfer_us(80 * 512, 656, rate) == pytest.approx(80 * 512 * 656 / (37 * 2**30) * 1e6)
    assert transfer_us(80 * 512, 656, rate) == pytest.approx(675, rel=0.005)


def test_rates_by_method_generation_and_override():
    h200, a100 = get_hardware("h200"), get_hardware("a100")
    assert h2d_bytes_per_s(EssConfig(transfer="memcpy"), h200) == pytest.approx(0.79 * GIB)
    assert d2h_bytes_per_s(EssConfig(), h200) == pytest.approx(43 * GIB)
    assert h2d_bytes_per_s(EssConfig(), a100) == pytest.approx(37 * GIB / 2)    # PCIe 4 is half of PCIe 5
    assert h2d_bytes_per_s(EssConfig(pcie_h2d_gibps=10), h200) == 10 * GIB
    assert d2h_bytes_per_s(EssConfig(pcie_h2d_gibps=18.5), h200) == pytest.approx(43 / 2 * GIB)


def test_transfer_rejects_negative():
    with pytest.raises(ValueError, match="rows"):
        transfer_us(-1, 656, 1e9)


# Hand case built from the paper's section-3 numbers: fetch 675, indexer 536, pre-attn + Attn0 = 252.
T = LayerPhaseTimes(indexer_us=536.0, pre_attn_us=52.0, attention_us=800 / 3, post_attn_us=40.0,
                    fetch_us=675.0, writeback_us=0.0, miss_fraction=0.25)   # Attn0 = 0.75 x 266.7 = 200


def test_overlap_hand_cases_match_paper_numbers():
    with overridden(da_merge_us=0.0, dba_split_us=0.0):
        assert overlap("none", T).exposed_us == pytest.approx(675)
        assert overlap("da", T).exposed_us == pytest.approx(675 - 252)           # 423
        # DBA: fetch0 runs 268..605.5, fetch1 605.5..943; Attn1 ready at 536 + 252 = 788 -> 155
        assert overlap("dba", T).exposed_us == pytest.approx(155)
        assert overlap("full", T).strategy == "dba"


def test_overlap_extras_and_writeback():
    with overridden(da_merge_us=5.0, dba_split_us=3.0):
        assert overlap("da", T).cost_us == pytest.approx(423 + 5)
        assert overlap("dba", T).cost_us == pytest.approx(155 + 8)
    wb = LayerPhaseTimes(100, 10, 100, 20, 0.0, 100.0, 0.5)   # write-back hides behind Attn1 50 + post 20
    assert overlap("none", wb).exposed_us == pytest.approx(100)
    assert overlap("da", wb).exposed_us == pytest.approx(30)


def test_small_fetch_fully_hidden_and_no_transfer_costs_nothing():
    small = LayerPhaseTimes(100, 50, 200, 20, 100.0, 0.0, 0.1)
    assert overlap("da", small).exposed_us == 0.0
    zero = LayerPhaseTimes(100, 50, 200, 20, 0.0, 0.0, 0.0)
    for s in ("none", "da", "dba", "full"):
        assert overlap(s, zero).cost_us == 0.0


def test_dba_gains_at_most_half_the_indexer_so_full_picks_da_for_short_indexers():
    short_idx = LayerPhaseTimes(20, 50, 200, 20, 300.0, 0.0, 0.2)
    with overridden(da_merge_us=0.0, dba_split_us=0.0):
        gain = overlap("da", short_idx).exposed_us - overlap("dba", short_idx).exposed_us
        assert gain == pytest.approx(10.0)                        # I / 2
    with overridden(da_merge_us=0.0, dba_split_us=15.0):
        assert overlap("full", short_idx).strategy == "da"
        assert overlap("full", T).strategy == "dba"
