import pytest

import hetmem

from conftest import MiB, PAGE


def test_runtime_driver_devices(runtime):
    drv = runtime.driver
    assert drv.backend == "host"
    assert [d.ordinal for d in drv.devices] == [0, 1]
    dev = drv.device(1)
    assert dev == drv.devices[1] and dev != drv.devices[0]
    assert dev.capacity == 256 * MiB
    assert dev.max_alloc_size == 128 * MiB
    assert dev.free_memory() == dev.capacity - dev.used_memory
    assert drv.host_config() == {
        "devices": 2,
        "device_memory": 256 * MiB,
        "max_alloc_size": 128 * MiB,
    }
    assert len(runtime.drivers()) == 1
    with pytest.raises(ValueError, match="device 5 does not exist"):
        drv.device(5)


def test_page_size_rule(ctx):
    assert ctx.query_page_size(1) == 64 << 10
    assert ctx.query_page_size(PAGE) == PAGE
    assert ctx.query_page_size(64 * MiB, device=1) == PAGE


def test_bad_configuration_is_an_invalid_argument():
    with pytest.raises(hetmem.InvalidArgumentError, match='"gpu"') as e:
        hetmem.Runtime("gpu")
    assert e.value.code == 0x78000004
    assert e.value.name == "ZE_RESULT_ERROR_INVALID_ARGUMENT"
    with pytest.raises(hetmem.InvalidArgumentError, match="device count is 0"):
        hetmem.Runtime("host", host_devices=0)
    with pytest.raises(hetmem.InvalidArgumentError, match="unknown unit"):
        hetmem.Runtime("host", host_device_memory="12Q")


def test_error_carries_code_and_message(ctx):
    with pytest.raises(hetmem.UnsupportedSizeError) as e:
        ctx.reserve(3)
    err = e.value
    assert isinstance(err, hetmem.HetmemError)
    assert err.code == err.ze_result == 0x78000009
    assert err.name == err.ze_name == "ZE_RESULT_ERROR_UNSUPPORTED_SIZE"
    assert err.acl_error == 107000
    assert "0x3" in err.message and err.message in str(err)
    assert str(err).startswith("ZE_RESULT_ERROR_UNSUPPORTED_SIZE (0x78000009): ")


def test_every_error_class_is_a_hetmem_error():
    names = [n for n in dir(hetmem) if n.endswith("Error")]
    assert len(names) >= 17
    for n in names:
        assert issubclass(getattr(hetmem, n), hetmem.HetmemError), n


def test_uninitialized_cuda_or_a_gpu():
    # Without a GPU the cuda backend refuses to start, with the reason; with one it starts.
    try:
        rt = hetmem.Runtime("cuda")
    except hetmem.UninitializedError as e:
        assert e.code == 0x78000001
        assert "cuda backend cannot start" in e.message
    else:
        assert rt.driver.backend == "cuda"


def test_extreme_values_raise_errors_not_panics(ctx):
    # PyO3 turns a Rust panic into pyo3_runtime.PanicException (a BaseException, not an
    # Exception): every case here must be an ordinary exception.
    huge = (1 << 64) - (1 << 16)
    cases = [
        lambda: ctx.reserve(huge),
        lambda: ctx.alloc_host(huge),
        lambda: ctx.get_access_attribute(huge, 1 << 16),
        lambda: ctx.unmap(huge, 1 << 16),
        lambda: ctx.reserve(1 << 16).map(huge, ctx.create_physical_memory(1 << 16)),
        lambda: ctx.alloc_host(4096).view(huge, 4096),
        lambda: ctx.alloc_host(4096).read(4000, huge),
        lambda: ctx.get_ipc_handle(huge, range_size=huge),
        lambda: ctx.memcpy(huge, huge, huge),
        lambda: ctx.alloc_managed(1 << 63),
        lambda: ctx.reserve(-1),
    ]
    for i, case in enumerate(cases):
        with pytest.raises(Exception) as e:
            case()
        assert type(e.value).__name__ != "PanicException", (i, e.value)
