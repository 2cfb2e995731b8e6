import multiprocessing as mp
import pickle

import pytest

import hetmem

from conftest import PAGE


def _child_reads_allocation(handle, q):
    import numpy

    ctx = hetmem.Runtime("host", host_devices=1, host_device_memory="64M").create_context()
    with ctx.open_ipc_handle(handle) as view:
        a = numpy.asarray(view)
        q.put((view.size, int(a[0]), int(a[-1]), int(a.sum() % 251)))
        a[1] = 99  # the exporter sees it
    q.put("closed")


def _child_reads_range(handle, n, q):
    import numpy

    ctx = hetmem.Runtime("host", host_devices=1, host_device_memory="64M").create_context()
    view = ctx.open_ipc_handle(handle)
    a = numpy.asarray(view).reshape(n, -1)
    q.put([int(a[i, 0]) for i in range(n)])
    a[1, 5] = 77
    view.close()
    q.put("closed")


def _spawn(target, *args):
    mpc = mp.get_context("spawn")
    q = mpc.Queue()
    p = mpc.Process(target=target, args=(*args, q))
    p.start()
    return p, q


def test_handle_is_picklable_bytes(ctx):
    a = ctx.alloc_device(PAGE, ipc=True)
    h = a.ipc_handle()
    assert len(bytes(h)) == 64
    assert h.kind == "allocation" and h.size == PAGE
    assert pickle.loads(pickle.dumps(h)) == h
    assert hetmem.IpcHandle(bytes(h)) == h
    with pytest.raises(ValueError, match="64 bytes"):
        hetmem.IpcHandle(b"short")
    ctx.put_ipc_handle(h)
    with pytest.raises(hetmem.InvalidArgumentError, match="already put"):
        ctx.put_ipc_handle(h)


def test_garbage_handle_is_refused(ctx):
    with pytest.raises(hetmem.InvalidArgumentError):
        ctx.open_ipc_handle(bytes(64))
    assert hetmem.IpcHandle(bytes(64)).kind is None


def test_two_processes_share_an_allocation(ctx, np):
    a = ctx.alloc_device(PAGE)
    arr = np.asarray(a)
    arr[:] = np.arange(PAGE, dtype=np.uint64).astype(np.uint8)
    expect = (PAGE, int(arr[0]), int(arr[-1]), int(arr.sum() % 251))
    p, q = _spawn(_child_reads_allocation, a.ipc_handle())
    try:
        assert q.get(timeout=60) == expect
        assert q.get(timeout=60) == "closed"
    finally:
        p.join(60)
    assert p.exitcode == 0
    assert arr[1] == 99


def test_one_range_handle_shares_several_physical_objects(ctx, np):
    n = 3
    r = ctx.reserve(n * PAGE)
    objs = [ctx.create_physical_memory(PAGE) for _ in range(n)]
    for i, o in enumerate(objs):
        r.map(i * PAGE, o)
        r.view(i * PAGE, PAGE).fill(10 + i)
    h = ctx.get_ipc_handle(r, range_size=n * PAGE)
    assert h.kind == "range" and h.size == n * PAGE
    p, q = _spawn(_child_reads_range, h, n)
    try:
        assert q.get(timeout=60) == [10, 11, 12]
        assert q.get(timeout=60) == "closed"
    finally:
        p.join(60)
    assert p.exitcode == 0
    assert r.read(PAGE + 5, 1) == b"\x4d"  # 77, written by the other process


def test_range_handle_of_a_hole_names_the_byte(ctx):
    r = ctx.reserve(2 * PAGE)
    r.map(0, ctx.create_physical_memory(PAGE))
    with pytest.raises(hetmem.AddressNotFoundError, match=hex(r.base + PAGE)):
        ctx.get_ipc_handle(r, range_size=2 * PAGE)
    with pytest.raises(hetmem.InvalidSizeError):
        ctx.get_ipc_handle(r, range_size=0)


def test_physical_object_handle_imports_in_process(ctx):
    phys = ctx.create_physical_memory(PAGE, ipc=True)
    r = ctx.reserve(PAGE)
    r.map(0, phys)
    r.fill(3)
    h = phys.ipc_handle()
    assert h.kind == "physical"
    other = ctx.driver.create_context()
    imported = other.import_physical_memory(h)
    assert imported.size == PAGE
    r2 = other.reserve(PAGE)
    r2.map(0, imported)
    assert r2.read(0, 4) == b"\x03" * 4
