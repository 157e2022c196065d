"""kernels/uva.py's CUDA runtime calls through cuda-python (issue 32: by named flags, not ctypes numbers),
against a runtime double that records them: chunked registration with cudaHostRegisterReadOnly for a
reader's mapping, every chunk unregistered (also when a later chunk fails), device pointers asked of
CUDA and a pointer it does not know refused."""
import pytest
import torch

pytest.importorskip("cuda.bindings")

from cuda.bindings import runtime  # noqa: E402

from sgl_ess.kernels import cuda_api, uva  # noqa: E402

OK = runtime.cudaError_t.cudaSuccess


class Runtime:
    def __init__(self, fail_at: int | None = None):
        self.fail_at, self.calls, self.registered = fail_at, [], set()

    def __getattr__(self, name):
        return getattr(runtime, name)

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        if self.fail_at is not None and len(self.registered) == self.fail_at:
            return (runtime.cudaError_t.cudaErrorMemoryAllocation,)
        self.registered.add(ptr)
        return (OK,)

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        if ptr not in self.registered:
            return (runtime.cudaError_t.cudaErrorHostMemoryNotRegistered,)
        self.registered.discard(ptr)
        return (OK,)

    def cudaHostGetDevicePointer(self, ptr, flags):
        return (OK, ptr + 0x1000) if ptr in self.registered else (runtime.cudaError_t.cudaErrorInvalidValue, None)


@pytest.fixture
def rt(monkeypatch):
    r = Runtime()
    monkeypatch.setattr(cuda_api, "runtime", lambda: r)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return r


def test_a_read_only_registration_in_chunks_and_its_release(rt):
    t = torch.zeros(10_000, dtype=torch.uint8)
    reg = uva.register_host(t, chunk_bytes=4096, readonly=True)
    p = t.data_ptr()
    assert [c[:3] for c in rt.calls] == [("register", p, 4096), ("register", p + 4096, 4096),
                                         ("register", p + 8192, 1808)]
    assert all(c[3] == runtime.cudaHostRegisterReadOnly for c in rt.calls)
    assert uva.device_pointer(p) == p + 0x1000
    reg.unregister()
    assert not rt.registered and not reg.chunks and reg not in uva._REGISTERED
    with pytest.raises(RuntimeError, match="cudaHostGetDevicePointer failed: cudaErrorInvalidValue.*pin_host"):
        uva.device_pointer(p)


def test_a_default_registration_uses_the_default_flag(rt):
    reg = uva.register_host(torch.zeros(100, dtype=torch.uint8))
    assert rt.calls[0][3] == runtime.cudaHostRegisterDefault
    reg.unregister()


def test_a_failing_chunk_releases_the_ones_before_it_and_names_the_flag(monkeypatch):
    r = Runtime(fail_at=1)
    monkeypatch.setattr(cuda_api, "runtime", lambda: r)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="cudaHostRegister at byte 4096.*cudaErrorMemoryAllocation.*"
                                           "--ess-memory-pool-size-gb"):
        uva.register_host(torch.zeros(10_000, dtype=torch.uint8), chunk_bytes=4096)
    assert not r.registered
