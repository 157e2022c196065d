"""The Triton sparse-MLA decode's shared memory (sparse_mla_smem.py) on CPU: the depth picked per
device from its opt-in limit (A100 164 KiB, L40S 99 KiB, H200 227 KiB, passed in, no GPU), the
refusal where nothing fits, and the figure checked against Triton's own compiler: the kernel is
compiled for sm_80 / sm_90 targets on this CPU (Triton + its bundled ptxas, no GPU) and the
compiled shared memory (`metadata.shared`) must stay within the model and within each device's
limit at the depth the launcher picks."""
from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")

from sgl_ess.kernels import sparse_mla_triton  # noqa: E402
from sgl_ess.kernels.latent_layout import FP8_TILE, LatentLayout  # noqa: E402
from sgl_ess.kernels.sparse_mla_smem import (  # noqa: E402
    decode_shared_memory_bytes, padded_dims, pick_decode_stages)

KIB = 1024
# shared_memory_per_block_optin as CUDA reports it
DEVICES = {"NVIDIA A100-SXM4-80GB": (80, 164 * KIB), "NVIDIA L40S": (89, 99 * KIB),
           "NVIDIA H200": (90, 227 * KIB)}
V32_FP8 = LatentLayout("fp8_flashmla", 512, 64)
_KINDS = {"fp8_flashmla": 0, "bf16": 1, "fp32": 2}
_NOPE_PTR = {"fp8_flashmla": "*u8", "bf16": "*bf16", "fp32": "*fp32"}


def compiled_shared_bytes(cc, layout, block_h, block_kv, num_stages, mask=False, sink=False):
    """Triton's compiled shared memory of the decode kernel for a CUDA target `cc`, on this CPU."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    ptr = {n: "*fp32" for n in ("scale_ptr", "sink_ptr", "out_ptr", "lse_ptr")}
    sig = {"q_ptr": "*bf16", "nope_ptr": _NOPE_PTR[layout.kind], "rope_ptr": "*bf16",
           "slots_ptr": "*i64", "mask_ptr": "*i8" if mask else "*i64", **ptr, "sm_scale": "fp32",
           **{n: "i32" for n in ("H", "stride_qt", "stride_qh", "nope_stride", "rope_stride",
                                 "rope_off", "scale_stride", "scale_off")}}
    r_pad, rope_pad = padded_dims(layout.kv_lora_rank, layout.rope_dim)
    const = {"K": 2048, "R": layout.kv_lora_rank, "ROPE": layout.rope_dim, "R_PAD": r_pad,
             "ROPE_PAD": rope_pad, "KIND": _KINDS[layout.kind], "TILE": FP8_TILE, "HAS_MASK": mask,
             "HAS_SINK": sink, "BLOCK_H": block_h, "BLOCK_KV": block_kv}
    sig.update({n: "constexpr" for n in const})
    src = ASTSource(sparse_mla_triton._sparse_mla_decode_kernel, sig, const)
    kernel = triton.compile(src, target=GPUTarget("cuda", cc, 32),
                            options={"num_warps": 8, "num_stages": num_stages})
    return kernel.metadata.shared


def _launch_stages(monkeypatch, name, limit):
    """The depth the launcher picks on a CUDA device with these properties (props passed in)."""
    props = SimpleNamespace(name=name, shared_memory_per_block_optin=limit)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=None: props)
    sparse_mla_triton._stages_for_cuda.cache_clear()
    try:
        return sparse_mla_triton._stages_for(torch.device("cuda", 0), V32_FP8, 16, 16)
    finally:
        sparse_mla_triton._stages_for_cuda.cache_clear()


@pytest.mark.parametrize("name,want", [("NVIDIA A100-SXM4-80GB", 2), ("NVIDIA L40S", 1),
                                       ("NVIDIA H200", 3)])
def test_the_launch_fits_each_device(monkeypatch, name, want):
    cc, limit = DEVICES[name]
    stages = _launch_stages(monkeypatch, name, limit)
    assert stages == want
    assert compiled_shared_bytes(cc, V32_FP8, 16, 16, stages) <= limit
    if stages < 3:    # the deepest that fits: one stage more would not
        assert compiled_shared_bytes(cc, V32_FP8, 16, 16, stages + 1) > limit


def test_a_device_too_small_for_one_stage_is_refused(monkeypatch):
    with pytest.raises(ValueError) as err:
        _launch_stages(monkeypatch, "Tesla T4", 64 * KIB)
    msg = str(err.value)
    need = decode_shared_memory_bytes("fp8_flashmla", 512, 64, 16, 16, 1)
    assert f"needs {need} B" in msg and f"Tesla T4 allows {64 * KIB} B" in msg
    assert "--dsa-decode-backend flashmla_kv" in msg and "--enable-mixed-chunk" in msg


BF16 = LatentLayout("bf16", 512, 64)
SMALL_FP8, SMALL_FP32 = LatentLayout("fp8_flashmla", 128, 64), LatentLayout("fp32", 64, 16)
# V3.2's two layouts at every depth and two tiles; small latents where scratch, not staging, leads
BOUND_CASES = ([(lay, tiles, st) for lay in (V32_FP8, BF16) for tiles in ((16, 16), (32, 16)) for st in (1, 2, 3)]
               + [(SMALL_FP8, (16, 32), 3), (SMALL_FP32, (32, 16), 1), (SMALL_FP32, (16, 32), 3)])


@pytest.mark.parametrize("layout,tiles,stages", BOUND_CASES)
def test_the_model_bounds_the_compiled_figure(layout, tiles, stages):
    # sm_80 only: the compiled figures of this kernel are the same for sm_80, 86, 89 and 90
    model = decode_shared_memory_bytes(layout.kind, layout.kv_lora_rank, layout.rope_dim, *tiles, stages)
    assert compiled_shared_bytes(80, layout, *tiles, stages) <= model


def test_mask_and_sink_add_no_shared_memory_beyond_the_model():
    model = decode_shared_memory_bytes("fp8_flashmla", 512, 64, 16, 16, 3)
    assert compiled_shared_bytes(90, V32_FP8, 16, 16, 3, mask=True, sink=True) <= model


def test_pick_from_limits_alone():
    # plain arithmetic, the same answers as the launch test
    assert [pick_decode_stages("fp8_flashmla", 512, 64, 16, 16, lim) for lim in
            (164 * KIB, 99 * KIB, 227 * KIB)] == [2, 1, 3]
    assert pick_decode_stages("bf16", 512, 64, 16, 16, 99 * KIB) == 3   # no scale gather to buffer
