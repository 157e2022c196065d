"""Issue 32 (review of defect 3's fix): the adapter makes a release wait for its zeroing on the host only
on a PD decode node (--disaggregation-mode decode: Mooncake / NIXL write host rows outside every stream);
colocated and on a PD prefill node the forwards' writes are ordered after the zeroing on the device
(LatentStore.clear_host / fence_host; tests/unit/store/test_release_external_write.py)."""
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.pools.pool_adapter import EssPoolAdapter  # noqa: E402

from ._fake_runner import fake_runner, shared_pools  # noqa: E402
from ._spec_fixtures import ess_env  # noqa: E402,F401


@pytest.mark.parametrize("mode,external", [("null", False), ("prefill", False), ("decode", True)])
def test_the_adapter_marks_an_external_host_writer_on_a_pd_decode_node_only(ess_env, mode, external):
    cfg = ess_env()
    req_pool, alloc = shared_pools()
    runner = fake_runner(req_pool, alloc, 2)
    runner.server_args = SimpleNamespace(disaggregation_mode=mode)
    adapter = EssPoolAdapter(runner, cfg)
    try:
        assert adapter.store.external_host_writer is external
    finally:
        adapter.shutdown()
