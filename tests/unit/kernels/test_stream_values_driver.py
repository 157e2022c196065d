"""Issue 32, defect 4: the stream memory operations' support check asks the attribute of the functions it
calls - CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS (v2, 122), not the legacy ..._V1 (93, off on a
stock driver) - by cuda.bindings' named enums, through a driver double answering as a stock driver
(tests/stream_doubles.StockDriver); the stream double's value mapping asks it, as CudaStreams does."""
import pytest
import torch

pytest.importorskip("cuda.bindings")

from cuda.bindings import driver  # noqa: E402

from sgl_ess.kernels import stream_values  # noqa: E402
from tests.stream_doubles import LateStreams, StockDriver  # noqa: E402

A = driver.CUdevice_attribute


def test_a_stock_driver_is_accepted_and_the_v2_attribute_is_asked():
    drv = StockDriver()
    stream_values.check_supported(0, drv=drv)
    assert drv.queried == [A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS]
    assert int(drv.queried[0]) == 122


def test_a_driver_without_the_v2_operations_is_refused_naming_the_flag():
    drv = StockDriver({A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: 0,
                       A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1: 1})
    with pytest.raises(RuntimeError, match="CAN_USE_64_BIT_STREAM_MEM_OPS is 0.*--ess-share-host-pool off"):
        stream_values.check_supported(0, drv=drv)


def test_a_failing_call_names_the_call_the_status_and_the_flag():
    with pytest.raises(RuntimeError, match=r"cuDeviceGet\(3\) failed: CUDA_ERROR_INVALID_DEVICE.*share-host-pool off"):
        stream_values.check_supported(3, drv=StockDriver())


def test_value_operations_pass_the_named_flags():
    drv = StockDriver()
    stream_values.write_value(11, 4096, 5, drv=drv)
    stream_values.wait_value(12, 4104, 6, drv=drv)
    assert drv.calls == [("write", 11, 4096, 5, driver.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT),
                         ("wait", 12, 4104, 6, driver.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ)]


def test_the_stream_double_asks_the_driver_when_it_maps_values():
    streams = LateStreams()
    t = torch.zeros(4, dtype=torch.int64)
    assert streams.map_values(t) is t
    assert streams.driver.queried == [A.CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS]
    refused = LateStreams(driver=StockDriver({}))
    with pytest.raises(RuntimeError, match="--ess-share-host-pool off"):
        refused.map_values(t)
