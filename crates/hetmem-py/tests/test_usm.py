import ctypes
import gc

import pytest

import hetmem

from conftest import MiB


@pytest.mark.parametrize("kind", ["host", "device", "shared"])
def test_allocations_are_numpy_arrays(ctx, np, kind):
    a = getattr(ctx, "alloc_" + kind)(1 * MiB)
    assert a.type == getattr(hetmem.MemoryType, kind.upper())
    arr = np.asarray(a)
    assert arr.shape == (MiB,) and arr.ctypes.data == a.ptr
    arr[:] = 5
    assert a.read(MiB - 3) == b"\x05\x05\x05"
    assert ctx.allocation_properties(a)["memory_type"] == a.type
    assert ctx.address_range(a.ptr + 7) == (a.ptr, MiB)
    assert a.__dlpack_device__() == (1, 0)
    assert not hasattr(a, "__cuda_array_interface__")
    a.free()
    assert not a.alive


def test_typed_views(ctx, np):
    a = ctx.alloc_host(4096)
    f = np.asarray(a.view(0, 64, dtype="float32", shape=(4, 4)))
    assert f.dtype == np.float32 and f.shape == (4, 4)
    f[:] = np.arange(16, dtype=np.float32).reshape(4, 4)
    raw = np.frombuffer(a.read(0, 64), dtype=np.float32)
    assert (raw == np.arange(16)).all()
    with pytest.raises(ValueError, match="past the end"):
        a.view(4000, 200)
    with pytest.raises(ValueError, match="not a multiple"):
        a.view(0, 6, dtype="int32")
    with pytest.raises(ValueError, match="does not hold"):
        a.view(0, 64, dtype="float32", shape=(3, 3))
    with pytest.raises(ValueError, match="is not one of"):
        a.view(0, 64, dtype="complex7")
    with pytest.raises(AttributeError, match="typestr"):
        a.view(0, 64, dtype="bfloat16").__array_interface__


def test_dlpack_is_zero_copy_and_counted(ctx, np):
    a = ctx.alloc_device(4096)
    x = np.from_dlpack(a.view(0, 4096, dtype="int32"))
    assert x.ctypes.data == a.ptr and x.shape == (1024,)
    x[:] = 7
    assert a.read(0, 4) == (7).to_bytes(4, "little")
    assert a.dlpack_exports == 1
    with pytest.raises(BufferError, match="DLPack export"):
        a.free()
    assert a.alive
    del x
    gc.collect()
    assert a.dlpack_exports == 0
    a.free()


def _capsule_name(cap):
    get = ctypes.pythonapi.PyCapsule_GetName
    get.restype = ctypes.c_char_p
    get.argtypes = [ctypes.py_object]
    return get(cap)


def test_dlpack_capsules_legacy_and_versioned(ctx):
    a = ctx.alloc_host(4096)
    cap = a.__dlpack__()
    assert _capsule_name(cap) == b"dltensor"
    assert a.dlpack_exports == 1
    del cap  # never consumed: the capsule's destructor deletes the tensor
    gc.collect()
    assert a.dlpack_exports == 0
    cap = a.__dlpack__(max_version=(1, 0))
    assert _capsule_name(cap) == b"dltensor_versioned"
    del cap
    gc.collect()
    assert a.dlpack_exports == 0
    with pytest.raises(BufferError, match="copy"):
        a.__dlpack__(copy=True)
    with pytest.raises(BufferError, match="device"):
        a.__dlpack__(dl_device=(2, 0))


def test_memoryview_keeps_the_allocation_alive(ctx, runtime):
    n = runtime.driver.usm_stats()["allocations"]
    mv = ctx.alloc_shared(8192).memoryview()
    gc.collect()
    assert runtime.driver.usm_stats()["allocations"] == n + 1
    mv[10] = 3
    assert mv[10] == 3 and len(mv) == 8192
    del mv
    gc.collect()
    assert runtime.driver.usm_stats()["allocations"] == n


def test_fill_and_memcpy(ctx):
    a = ctx.alloc_host(4096)
    b = ctx.alloc_device(4096)
    a.fill(0xAB)
    ctx.memcpy(b, a, 4096)
    assert b.read() == b"\xab" * 4096
    ctx.memset(b.ptr + 10, 1, 2)
    assert b.read(8, 6) == b"\xab\xab\x01\x01\xab\xab"


def test_usm_errors(ctx):
    with pytest.raises(hetmem.UnsupportedSizeError):
        ctx.alloc_host(0)
    with pytest.raises(hetmem.UnsupportedAlignmentError):
        ctx.alloc_device(4096, alignment=3)
    with pytest.raises(hetmem.UnsupportedSizeError):
        ctx.alloc_device(200 * MiB)  # over max_alloc_size (128 MiB)
    keep = [ctx.alloc_device(100 * MiB, relaxed_max_size=True, device=1) for _ in range(2)]
    with pytest.raises(hetmem.OutOfDeviceMemoryError):
        ctx.alloc_device(100 * MiB, device=1)
    del keep
    a = ctx.alloc_host(4096)
    with pytest.raises(hetmem.InvalidArgumentError):
        ctx.free_memory(a.ptr + 64)  # interior pointer
    with pytest.raises(hetmem.InvalidNullPointerError):
        ctx.free_memory(0)
    a.free()
    with pytest.raises(ValueError, match="freed"):
        a.free()
    with pytest.raises(ValueError, match="freed"):
        a.read()


def test_allocations_go_with_their_objects(ctx, runtime):
    n = runtime.driver.usm_stats()["allocations"]
    with ctx.alloc_host(4096) as a:
        assert runtime.driver.usm_stats()["allocations"] == n + 1
    assert not a.alive
    b = ctx.alloc_device(4096)
    del b
    gc.collect()
    assert runtime.driver.usm_stats()["allocations"] == n
