"""Issue 16 (defect 7): FlashMLA was handed the slot rows as uint8 where SGLang's own DSA backend
hands it float8_e4m3fn (its MLA pool stores FP8 rows as uint8 and views them in the logical dtype
in get_key_buffer). The CUDA backend's kv_cache view now has the pool's logical dtype."""
from types import SimpleNamespace

import torch

from sgl_ess.integration.sglang.pools.pool_adapter import EssPoolAdapter


def test_fp8_slot_rows_reach_the_kernel_as_float8_e4m3fn():
    rows = torch.randint(0, 256, (128, 656), dtype=torch.uint8)        # FlashMLA's 656-byte FP8 rows
    fake = SimpleNamespace(dtype=torch.uint8, kv_dtype=torch.float8_e4m3fn, kv_dim=656)
    kv = EssPoolAdapter.as_kv_cache(fake, rows)
    assert kv.dtype == torch.float8_e4m3fn and kv.shape == (128, 1, 656)
    assert kv.data_ptr() == rows.data_ptr()                              # a view, no copy
    bf16 = SimpleNamespace(dtype=torch.bfloat16, kv_dtype=torch.bfloat16, kv_dim=576)
    rows16 = torch.zeros((64, 1152), dtype=torch.uint8)
    assert EssPoolAdapter.as_kv_cache(bf16, rows16).shape == (64, 1, 576)
