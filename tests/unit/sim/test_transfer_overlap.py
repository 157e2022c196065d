"""Transfer and overlap mechanics on hand-computed cases (numbers chosen here, not taken from the paper)."""
import pytest

from sgl_ess.sim.config import OffloadConfig
from sgl_ess.sim.hardware import get_hardware
from sgl_ess.sim.overlap import DA_EXTRA_KERNELS, DBA_EXTRA_KERNELS, LayerPhaseTimes, overlap
from sgl_ess.sim.transfer import GB, d2h_bytes_per_s, h2d_bytes_per_s, transfer_us


def test_paper_rates_are_read_as_printed_gb():
    rate = h2d_bytes_per_s(OffloadConfig(), get_hardware("h200"))
    assert rate == 37e9                                   # "37 GB/s" = 37e9 B/s, not GiB
    assert transfer_us(1000, 656, rate) == pytest.approx(1000 * 656 / 37e9 * 1e6)


def test_rates_by_method_generation_and_override():
    h200, a100 = get_hardware("h200"), get_hardware("a100")
    assert h2d_bytes_per_s(OffloadConfig(transfer="memcpy"), h200) == pytest.approx(0.79 * GB)
    assert d2h_bytes_per_s(OffloadConfig(), h200) == pytest.approx(43 * GB)
    assert h2d_bytes_per_s(OffloadConfig(), a100) == pytest.approx(37 * GB / 2)    # PCIe 4 is half of PCIe 5
    assert h2d_bytes_per_s(OffloadConfig(pcie_h2d_gbps=10), h200) == 10 * GB
    assert d2h_bytes_per_s(OffloadConfig(pcie_h2d_gbps=18.5), h200) == pytest.approx(43 / 2 * GB)


def test_transfer_rejects_negative():
    with pytest.raises(ValueError, match="rows"):
        transfer_us(-1, 656, 1e9)


# indexer 400, pre-attn 100, attention 200 (25% misses -> Attn0 150, Attn1 50), post-attn 50, fetch 600
T = LayerPhaseTimes(indexer_us=400.0, pre_attn_us=100.0, attention_us=200.0, post_attn_us=50.0,
                    fetch_us=600.0, writeback_us=0.0, miss_fraction=0.25)


def test_overlap_hand_case():
    assert overlap("none", T).exposed_us == pytest.approx(600)
    assert overlap("da", T).exposed_us == pytest.approx(600 - (100 + 150))          # 350
    # DBA: fetch0 200..500, fetch1 500..800; Attn1 can start at 400 + 100 + 150 = 650 -> 150 exposed
    assert overlap("dba", T).exposed_us == pytest.approx(150)


def test_split_strategies_pay_in_kernel_launches_and_full_picks_the_cheaper():
    assert overlap("none", T).extra_kernels == 0
    assert overlap("da", T).extra_kernels == DA_EXTRA_KERNELS
    assert overlap("dba", T).extra_kernels == DBA_EXTRA_KERNELS > DA_EXTRA_KERNELS
    assert overlap("da", T).cost_us(10.0) == pytest.approx(350 + 10 * DA_EXTRA_KERNELS)
    assert overlap("full", T, kernel_overhead_us=0.0).strategy == "dba"           # 150 < 350
    # launches priced at 100 us: da 350 + 300 = 650 < dba 150 + 600 = 750
    assert overlap("full", T, kernel_overhead_us=100.0).strategy == "da"


def test_writeback_hides_behind_attn1_and_post_attn():
    wb = LayerPhaseTimes(100, 10, 100, 20, 0.0, 100.0, 0.5)   # Attn1 50 + post 20 = 70 of 100 hidden
    assert overlap("none", wb).exposed_us == pytest.approx(100)
    assert overlap("da", wb).exposed_us == pytest.approx(30)


def test_small_fetch_fully_hidden_and_no_transfer_costs_nothing():
    small = LayerPhaseTimes(100, 50, 200, 20, 100.0, 0.0, 0.1)
    assert overlap("da", small).exposed_us == 0.0
    zero = LayerPhaseTimes(100, 50, 200, 20, 0.0, 0.0, 0.0)
    for s in ("none", "da", "dba", "full"):
        assert overlap(s, zero).cost_us(50.0) == 0.0


def test_dba_gains_at_most_half_the_indexer():
    short_idx = LayerPhaseTimes(20, 50, 200, 20, 300.0, 0.0, 0.2)
    gain = overlap("da", short_idx).exposed_us - overlap("dba", short_idx).exposed_us
    assert gain == pytest.approx(10.0)                        # indexer / 2


def test_unknown_strategy():
    with pytest.raises(ValueError, match="--overlap"):
        overlap("half", T)
