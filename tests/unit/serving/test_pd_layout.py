"""The bootstrap check of the latent row layout between PD roles (integration/sglang/pools/pd_layout.py)."""
import pytest

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.pools.pd_layout import mismatch  # noqa: E402


def test_equal_pages_pass_and_unknown_peers_are_let_be():
    assert mismatch(64 * 160, 64 * 160, 64) is None
    assert mismatch(64 * 160, None, 64) is None


def test_another_row_layout_is_refused_with_both_sizes_and_the_flags():
    msg = mismatch(64 * 160, 64 * 656, 64)          # BF16 tiny rows vs FP8 656-byte rows
    assert "10240 bytes" in msg and "41984" in msg and "(160 vs 656 bytes per row)" in msg
    assert "--kv-cache-dtype" in msg and "--dtype" in msg and "--page-size" in msg


class _Manager:
    """Stands in for SGLang's Mooncake KV manager: only what the check reads (no transfer engine)."""

    def __init__(self, item_len, page=64, own_verdict=(True, None)):
        self.kv_args = type("KVArgs", (), {"kv_item_lens": [item_len, 4096], "page_size": page})()
        self.verdict = own_verdict

    def _validate_peer_state_layout(self, registration_info):
        return self.verdict


def _peer(item_len):
    return type("Reg", (), {"dst_kv_item_len": item_len})()


def test_the_managers_own_validation_gains_the_latent_check_once():
    from sgl_ess.integration.sglang.pools.pd_layout import _after_manager_init

    m = _Manager(64 * 160)
    _after_manager_init(None, m)
    _after_manager_init(None, m)                      # a second init hook does not wrap twice
    assert getattr(m._validate_peer_state_layout, "_sgl_ess_checked", False)
    assert m._validate_peer_state_layout(_peer(64 * 160)) == (True, None)
    checked, reason = m._validate_peer_state_layout(_peer(64 * 656))
    assert checked is True and "latent row layout mismatch" in reason
    own = _Manager(64 * 160, own_verdict=(False, "DSA item length mismatch"))
    _after_manager_init(None, own)
    assert own._validate_peer_state_layout(_peer(64 * 656)) == (False, "DSA item length mismatch")   # SGLang's first
