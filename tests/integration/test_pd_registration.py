"""Issue 18, item 2: what a PD node registers with the transfer engine when its latent rows live in the
ESS host pool. GPU fake: the ESS pool class built for a "cuda" device on this CPU, with only the
pinning and the zero-copy device view swapped (the view is a copy at another address, as a real
device view of host memory has its own address). Checked: SGLang's PD registration
(``get_contiguous_buf_infos``) gets the host rows' addresses, not the device views', one page of rows
per item; those buffers are NIXL memory kind DRAM on both roles, with SGLang's own NIXL helpers
accepting the kinds (a prefill needs them all alike). Nothing here ran NIXL, Mooncake's RDMA path or
a GPU: neither exists on this machine."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sgl_ess.integration.sglang.pools import host_pool_class, pd_layout, shared_host_pool  # noqa: E402
from sgl_ess.store.host_pool import HostLatentPool  # noqa: E402

LAYERS, SIZE, PAGE, DIM = 3, 256, 64, 656


@pytest.fixture
def gpu_fake_pool(monkeypatch):
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
    from sgl_ess.kernels import uva

    monkeypatch.setattr(shared_host_pool, "build", lambda layers, rows, row_bytes, on_cuda, lock, share_mode="auto":
                        (HostLatentPool(layers, rows, row_bytes, pin=False, lock=lock), None))
    monkeypatch.setattr(uva, "device_view", lambda t: t.clone())      # another address, like a device view
    monkeypatch.setattr(host_pool_class, "_host_spans", [])
    cls = host_pool_class.host_backed(DSATokenToKVPool)
    pool = cls.__new__(cls)
    pool.size, pool.page_size, pool.layer_num, pool.kv_cache_dim = SIZE, PAGE, LAYERS, DIM
    pool.store_dtype, pool.device = torch.uint8, "cuda:0"
    pool._create_buffers()
    return pool


def test_gpu_fake_pd_registration_gives_the_host_rows_not_the_device_views(gpu_fake_pool):
    pool = gpu_fake_pool
    ptrs, lens, items = pool.get_contiguous_buf_infos()
    host = pool.ess_host_pool.rows
    assert ptrs == [host[i].data_ptr() for i in range(LAYERS)]
    assert all(p != pool.kv_buffer[i].data_ptr() for i, p in enumerate(ptrs)), "a device view was registered"
    assert lens == [(SIZE + PAGE) * DIM] * LAYERS and items == [PAGE * DIM] * LAYERS


def test_host_rows_are_nixl_dram_on_both_roles_and_sglang_accepts_the_kinds(gpu_fake_pool):
    from sglang.srt.disaggregation.nixl.conn import _homogeneous_kv_mem_kind, _normalize_kv_mem_kinds

    ptrs, _, _ = gpu_fake_pool.get_contiguous_buf_infos()
    device_buf = torch.zeros(8)                      # e.g. a draft model's pool on the device
    prefill = SimpleNamespace(kv_data_ptrs=list(ptrs))                     # SGLang's prefill passes no kinds
    pd_layout._before_manager_init(None, prefill)
    assert _homogeneous_kv_mem_kind(_normalize_kv_mem_kinds(prefill.kv_data_mem_kinds, len(ptrs)),
                                    "source") == "DRAM"
    decode = SimpleNamespace(kv_data_ptrs=list(ptrs) + [device_buf.data_ptr()],
                             kv_data_mem_kinds=["VRAM"] * (len(ptrs) + 1))   # what decode.py builds
    pd_layout._before_manager_init(None, decode)
    assert decode.kv_data_mem_kinds == ["DRAM"] * LAYERS + ["VRAM"]
    assert pd_layout.host_mem_kinds([device_buf.data_ptr()], None) == ["VRAM"]
