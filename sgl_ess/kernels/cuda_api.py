"""The CUDA driver and runtime APIs through cuda-python (``cuda.bindings``, an SGLang dependency), with
named enums instead of numbers (issue 32: a ctypes call asked attribute 93, the legacy
CAN_USE_64_BIT_STREAM_MEM_OPS_V1, for the v2 functions, whose attribute is 122), and one way to turn
a call's status into an error that says what failed and which flag avoids it.

  driver() / runtime()     the cuda.bindings modules (imported on first use: nothing here runs on CPU)
  check(result, what, fix) the values of a call's result tuple ``(status, *values)``; raises
                           RuntimeError naming the call, the status and `fix` unless it succeeded
Memory: none.
"""
from __future__ import annotations


def _bindings(name: str):
    try:
        from cuda.bindings import driver, runtime
    except ImportError as e:
        raise RuntimeError(f"the CUDA {name} API is called through cuda-python (cuda.bindings), which is not "
                           f"installed ({e}): pip install cuda-python (SGLang's own dependency)") from None
    return driver if name == "driver" else runtime


def driver():
    return _bindings("driver")


def runtime():
    return _bindings("runtime")


def check(result, what: str, fix: str):
    """`result` is a cuda.bindings return tuple (status, *values): the values (one value alone, None
    without any) if the status is success, else RuntimeError."""
    status, values = result[0], tuple(result[1:])
    if int(status) != 0:
        raise RuntimeError(f"{what} failed: {_describe(status)}; {fix}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _describe(status) -> str:
    name = getattr(status, "name", None) or str(int(status))
    try:
        mod = driver() if type(status).__name__ == "CUresult" else runtime()
        err, text = (mod.cuGetErrorString(status) if type(status).__name__ == "CUresult"
                     else mod.cudaGetErrorString(status))
        if int(err) == 0 and text:
            return f"{name} ({text.decode() if isinstance(text, bytes) else text})"
    except Exception:  # noqa: BLE001 - the name alone still says what failed
        pass
    return name
