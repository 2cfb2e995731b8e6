import gc

import pytest

import hetmem

from conftest import PAGE


def test_reserve_map_and_numpy_view(ctx, np):
    r = ctx.reserve(2 * PAGE)
    assert r.base == r.ptr and r.size == 2 * PAGE and r.end == r.base + 2 * PAGE
    assert r.base % PAGE == 0
    assert r.get_access() == (hetmem.Access.NONE, 2 * PAGE)
    phys = ctx.create_physical_memory(PAGE)
    r.map(0, phys)
    assert r.get_access(0, 2 * PAGE) == (hetmem.Access.READWRITE, PAGE)
    a = np.asarray(r.view(0, PAGE))
    assert a.dtype == np.uint8 and a.shape == (PAGE,)
    assert a.__array_interface__["data"][0] == r.base  # zero-copy
    a[:4] = [1, 2, 3, 4]
    assert r.read(0, 4) == b"\x01\x02\x03\x04"
    r.write(b"\xff\xfe", 2)
    assert list(a[:4]) == [1, 2, 255, 254]
    props = ctx.allocation_properties(r.base)
    assert props["memory_type"] == hetmem.MemoryType.DEVICE
    assert props["id"] == phys.id and props["device"] == 0
    assert ctx.address_range(r.base + 10) == (r.base, 2 * PAGE)


def test_aliases_share_bytes(ctx, np):
    r = ctx.reserve(2 * PAGE)
    phys = ctx.create_physical_memory(PAGE)
    r.map(0, phys)
    r.map(PAGE, phys)
    a = np.asarray(r.view(0, PAGE))
    b = np.asarray(r.view(PAGE, PAGE))
    a[100:110] = 42
    assert (b[100:110] == 42).all()


def test_export_of_unmapped_pages_is_refused(ctx, np):
    r = ctx.reserve(2 * PAGE)
    phys = ctx.create_physical_memory(PAGE)
    r.map(0, phys)
    with pytest.raises(BufferError, match="not mapped with access"):
        np.asarray(r)  # the second page is NONE
    with pytest.raises(BufferError):
        r.__dlpack__()
    r.unmap(0, PAGE)
    with pytest.raises(BufferError):
        r.view(0, PAGE).memoryview()


def test_readonly_access_gives_readonly_views(ctx, np):
    r = ctx.reserve(PAGE)
    phys = ctx.create_physical_memory(PAGE)
    r.map(0, phys, access=hetmem.Access.READONLY)
    assert r.get_access() == (hetmem.Access.READONLY, PAGE)
    mv = r.memoryview()
    assert mv.readonly and len(mv) == PAGE
    r.set_access(0, PAGE, hetmem.Access.READWRITE)
    mv = r.memoryview()
    mv[0] = 9
    assert r.read(0, 1) == b"\x09"


def test_vmm_errors_name_the_bad_value(ctx):
    r = ctx.reserve(2 * PAGE)
    phys = ctx.create_physical_memory(PAGE)
    with pytest.raises(hetmem.InvalidEnumerationError, match="7"):
        r.map(0, phys, access=7)
    with pytest.raises(hetmem.UnsupportedAlignmentError):
        ctx.map(r.base + 4096, PAGE, phys)
    with pytest.raises(hetmem.InvalidArgumentError):
        r.map(PAGE, phys, size=PAGE, phys_offset=PAGE)  # past the end of phys
    with pytest.raises(hetmem.UnsupportedSizeError, match="0x3"):
        ctx.reserve(3)
    r.map(0, phys)
    with pytest.raises(hetmem.HandleObjectInUseError):
        phys.destroy()
    assert phys.alive  # nothing changed
    with pytest.raises(hetmem.InvalidArgumentError):
        r.map(0, phys)  # over a mapping
    r.unmap(0, PAGE)
    phys.destroy()
    with pytest.raises(ValueError, match="already destroyed"):
        phys.destroy()


def test_free_and_context_manager(ctx, runtime):
    before = runtime.driver.vm_stats()["reservations"]
    with ctx.reserve(PAGE) as r:
        assert runtime.driver.vm_stats()["reservations"] == before + 1
    assert not r.alive
    assert runtime.driver.vm_stats()["reservations"] == before
    with pytest.raises(ValueError, match="freed"):
        r.ptr
    with pytest.raises(ValueError, match="freed"):
        r.free()
    r2 = ctx.reserve(PAGE)
    del r2
    gc.collect()
    assert runtime.driver.vm_stats()["reservations"] == before


def test_physical_on_host_and_capacity(ctx, runtime):
    dev = runtime.driver.device(1)
    used = dev.used_memory
    p = ctx.create_physical_memory(PAGE, device=1)
    assert dev.used_memory == used + PAGE
    h = ctx.create_physical_memory(PAGE, on_host=True)
    assert dev.used_memory == used + PAGE
    p.destroy()
    h.destroy()
    assert dev.used_memory == used
    with pytest.raises(hetmem.OutOfDeviceMemoryError):
        ctx.create_physical_memory(512 << 20, device=1)
