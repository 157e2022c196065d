"""The zero-copy views find the CUDA runtime torch itself loaded (issue 16: they opened a bare
``libcudart.so`` on every call, which torch wheels do not ship; they ship ``libcudart.so.NN``).
Read from a process's memory map; no GPU needed for the lookup."""

from sgl_ess.kernels.uva import cudart_paths_in_maps

SITE = "/venv/lib/python3.12/site-packages"
RUNTIME = f"{SITE}/nvidia/cuda_runtime/lib/libcudart.so.12"
MAPS = f"""\
7f0000000000-7f0000100000 r-xp 00000000 08:01 1 {SITE}/torch/lib/libtorch_cuda.so
7f0000200000-7f0000300000 r-xp 00000000 08:01 2 {RUNTIME}
7f0000300000-7f0000310000 r--p 00100000 08:01 2 {RUNTIME}
7f0000400000-7f0000401000 rw-p 00000000 00:00 0
7f0000500000-7f0000501000 rw-p 00000000 00:00 0 [heap]
"""


def test_the_mapped_runtime_is_found_once():
    assert cudart_paths_in_maps(MAPS) == [RUNTIME]
    assert cudart_paths_in_maps("") == []
