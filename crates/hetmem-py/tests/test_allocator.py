"""The allocator under hetmem.torch (its C entry points, tags, sleep / wake, sharing a tag's
span, the growable buffer), on the host backend: no torch needed."""

import ctypes
import multiprocessing as mp

import pytest

import hetmem
from hetmem import _hetmem

from conftest import MiB, PAGE


@pytest.fixture(scope="module", autouse=True)
def host_allocator():
    assert _hetmem.torch_init("host", 1 << 30) == "host"
    yield
    for b in _hetmem.torch_blocks():
        _hetmem.torch_free(b[0])


@pytest.fixture
def lib():
    so = ctypes.CDLL(_hetmem.__file__)
    so.hetmem_torch_malloc.restype = ctypes.c_void_p
    so.hetmem_torch_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    so.hetmem_torch_free.restype = None
    so.hetmem_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return so


@pytest.fixture
def tagged():
    def use(tag):
        return _Tag(tag)

    return use


class _Tag:
    def __init__(self, tag):
        self.tag = tag

    def __enter__(self):
        self.prev = _hetmem.torch_set_tag(self.tag)

    def __exit__(self, *a):
        _hetmem.torch_set_tag(self.prev)


def test_c_entry_points_allocate_blocks(lib):
    n = _hetmem.torch_stats()["blocks"]
    p = lib.hetmem_torch_malloc(3 * MiB, 0, None)
    assert p and p % PAGE == 0
    assert _hetmem.torch_block_of(p + 5) == (p, 4 * MiB, 0, "default", False)
    ctypes.memset(p, 0x3C, 3 * MiB)  # mapped READWRITE
    assert ctypes.string_at(p + 3 * MiB - 2, 2) == b"\x3c\x3c"
    assert _hetmem.torch_stats()["blocks"] == n + 1
    lib.hetmem_torch_free(p, 3 * MiB, 0, None)
    assert _hetmem.torch_block_of(p) is None
    assert _hetmem.torch_stats()["blocks"] == n
    assert lib.hetmem_torch_malloc(0, 0, None) is None


def test_malloc_failure_is_null_with_the_reason(lib):
    assert lib.hetmem_torch_malloc(PAGE, 7, None) is None
    assert "device 7 does not exist" in _hetmem.torch_last_error()
    assert lib.hetmem_torch_malloc(PAGE, -1, None) is None
    assert "-1" in _hetmem.torch_last_error()
    assert lib.hetmem_torch_malloc(2 << 30, 0, None) is None  # past the 1 GiB arena
    assert "HETMEM_TORCH_ARENA" in _hetmem.torch_last_error()
    lib.hetmem_torch_free(ctypes.c_void_p(4096), 0, 0, None)  # not a block: ignored
    assert "not a block" in _hetmem.torch_last_error()


def test_freed_addresses_are_reused_first_fit(tagged):
    with tagged("reuse"):
        a = _hetmem.torch_malloc(PAGE)
        b = _hetmem.torch_malloc(PAGE)
        c = _hetmem.torch_malloc(PAGE)
        assert (b - a, c - b) == (PAGE, PAGE)
        _hetmem.torch_free(b)
        assert _hetmem.torch_malloc(PAGE) == b
        for p in (a, b, c):
            _hetmem.torch_free(p)


def _fill(p, n, seed):
    ctypes.memmove(p, bytes((seed + i) % 251 for i in range(256)) * (n // 256), n)


def _check(p, n, seed):
    return ctypes.string_at(p, n) == bytes((seed + i) % 251 for i in range(256)) * (n // 256)


@pytest.mark.parametrize("offload", [True, False])
def test_sleep_and_wake_keep_the_addresses(tagged, runtime, offload):
    ctx = _hetmem.torch_context()
    dev = ctx.driver.device(0)
    with tagged("weights"):
        ps = [_hetmem.torch_malloc(s) for s in (PAGE, 3 * MiB, PAGE)]
    with tagged("kv"):
        other = _hetmem.torch_malloc(PAGE)
    sizes = [PAGE, 4 * MiB, PAGE]
    for i, (p, n) in enumerate(zip(ps, sizes)):
        _fill(p, n, i)
    used = dev.used_memory
    assert _hetmem.torch_sleep(["weights"], offload) == (3, 8 * MiB)
    assert dev.used_memory == used - 8 * MiB
    for p, n in zip(ps, sizes):
        assert ctx.get_access_attribute(p, n) == (hetmem.Access.NONE, n)
        assert _hetmem.torch_block_of(p)[4]  # asleep
    assert ctx.get_access_attribute(other, PAGE)[0] == hetmem.Access.READWRITE
    assert _hetmem.torch_sleep(["weights"], offload) == (0, 0)  # already asleep
    assert _hetmem.torch_wake(["weights"]) == (3, 8 * MiB)
    assert dev.used_memory == used
    for i, (p, n) in enumerate(zip(ps, sizes)):
        assert ctx.get_access_attribute(p, n) == (hetmem.Access.READWRITE, n)
        assert _check(p, n, i) == offload
    # a second cycle reuses the pinned copies
    if offload:
        assert _hetmem.torch_stats()["host_copy_bytes"] >= 8 * MiB
        _hetmem.torch_sleep(["weights"], True)
        _hetmem.torch_wake(["weights"], keep_host_copy=False)
        assert all(_check(p, n, i) for i, (p, n) in enumerate(zip(ps, sizes)))
    for p in ps + [other]:
        _hetmem.torch_free(p)
    assert _hetmem.torch_stats()["host_copy_bytes"] == 0


def test_a_sleeping_block_can_be_freed(tagged):
    with tagged("gone"):
        p = _hetmem.torch_malloc(PAGE)
    _hetmem.torch_sleep(["gone"], True)
    _hetmem.torch_free(p)
    assert _hetmem.torch_blocks("gone") == []
    assert _hetmem.torch_wake(["gone"]) == (0, 0)


def _child_reads_span(handle, n, q):
    ctx = hetmem.Runtime("host", host_devices=1, host_device_memory="64M").create_context()
    with ctx.open_ipc_handle(handle) as v:
        q.put([v.read(i * PAGE, 1)[0] for i in range(n)])


def test_a_tag_is_shared_with_one_range_handle(tagged):
    with tagged("share"):
        ps = [_hetmem.torch_malloc(PAGE) for _ in range(4)]
    for i, p in enumerate(ps):
        ctypes.memset(p, 20 + i, PAGE)
    h, base, size = _hetmem.torch_share("share")
    assert (base, size) == (ps[0], 4 * PAGE) == _hetmem.torch_span("share")[:1] + (4 * PAGE,)
    assert h.kind == "range"
    mpc = mp.get_context("spawn")
    q = mpc.Queue()
    proc = mpc.Process(target=_child_reads_span, args=(h, 4, q))
    proc.start()
    try:
        assert q.get(timeout=60) == [20, 21, 22, 23]
    finally:
        proc.join(60)
    assert proc.exitcode == 0
    _hetmem.torch_free(ps[1])  # a gap: the span cannot be one range any more
    with pytest.raises(hetmem.AddressNotFoundError, match=hex(ps[1])):
        _hetmem.torch_share("share")
    with pytest.raises(ValueError, match="no block"):
        _hetmem.torch_span("nothing")
    for p in ps[:1] + ps[2:]:
        _hetmem.torch_free(p)


def test_growable_keeps_its_address(np):
    ctx = _hetmem.torch_context()
    g = _hetmem.growable(ctx, 64 * MiB, chunk=4 * MiB)
    base = g.ptr
    assert g.capacity == 64 * MiB and g.used == 0 and g.mapped == 0
    arr = np.asarray(g)  # spans the whole capacity
    for step in range(1, 17):
        g.grow(2 * MiB)
        assert g.ptr == base == arr.ctypes.data
        assert g.used == step * 2 * MiB
        assert g.mapped == -(-step * 2 * MiB // (4 * MiB)) * 4 * MiB
        arr[g.used - 2 * MiB : g.used] = step
    assert all(arr[(s - 1) * 2 * MiB] == s for s in range(1, 17))
    assert g.shrink(20 * MiB) == 12 * MiB
    assert (g.mapped, g.pool_chunks) == (12 * MiB, 5)
    g.grow(8 * MiB)  # from the pool
    assert (g.mapped, g.pool_chunks) == (20 * MiB, 3)
    assert arr[0] == 1  # the bytes below the shrink point stayed
    # Inside the last chunk nothing is mapped or unmapped (the fast path): only `used` moves.
    assert g.shrink(1 * MiB) == 19 * MiB
    assert (g.used, g.mapped, g.pool_chunks) == (19 * MiB, 20 * MiB, 3)
    g.resize(17 * MiB)
    assert (g.used, g.mapped, g.pool_chunks) == (17 * MiB, 20 * MiB, 3)
    assert g.grow(0) == 17 * MiB and g.grow(3 * MiB) == 20 * MiB
    assert (g.mapped, g.pool_chunks) == (20 * MiB, 3)
    assert g.grow(1) == 20 * MiB + 1 and (g.mapped, g.pool_chunks) == (24 * MiB, 2)
    g.resize(20 * MiB)
    assert (g.mapped, g.pool_chunks) == (20 * MiB, 3)
    with pytest.raises(hetmem.UnsupportedSizeError, match="capacity"):
        g.resize(65 * MiB)
    g.fill_pool(32 * MiB)
    assert g.pool_chunks == 8
    g.trim_pool()
    assert g.pool_chunks == 0
    del arr
    g.free()
    with pytest.raises(ValueError, match="freed"):
        g.grow(0)  # no chunk to map, but the buffer is gone
    with pytest.raises(hetmem.UnsupportedSizeError, match="page size"):
        _hetmem.growable(ctx, 64 * MiB, chunk=3 * MiB)


def test_growable_default_chunk_is_64_mib():
    """The default chunk is 64 MiB (one cuMemMap + cuMemSetAccess per 32 growth steps of 2 MiB on
    a GPU; the growth row of bench/torch_bench.py measures 32, 64 and 128 MiB)."""
    ctx = _hetmem.torch_context()
    g = _hetmem.growable(ctx, 256 * MiB)
    assert g.chunk == 64 * MiB
    g.grow(1)
    assert g.mapped == 64 * MiB
    g.free()


def test_growable_grows_in_elements():
    ctx = _hetmem.torch_context()
    g = _hetmem.growable(ctx, 8 * MiB, chunk=2 * MiB, itemsize=4)
    assert g.itemsize == 4
    assert g.grow_items(3) == 3 and (g.used, g.mapped) == (12, 2 * MiB)
    assert g.grow_items(MiB // 2) == MiB // 2 + 3 and (g.used, g.mapped) == (2 * MiB + 12, 4 * MiB)
    with pytest.raises(hetmem.UnsupportedSizeError, match="capacity"):
        g.grow_items(2 * MiB)  # 8 MiB more: past the 8 MiB capacity
    assert (g.used, g.mapped) == (2 * MiB + 12, 4 * MiB)  # nothing changed
    g.free()
    with pytest.raises(ValueError, match="itemsize 0"):
        _hetmem.growable(ctx, 8 * MiB, chunk=2 * MiB, itemsize=0)


def test_growable_prefetches_chunks_in_the_background():
    ctx = _hetmem.torch_context()
    g = _hetmem.growable(ctx, 8 * MiB, chunk=2 * MiB, prefetch=2)  # 4 chunks at most
    assert g.prefetch == 2 and g.wait_prefetch() == 2 and g.mapped == 0
    g.grow(2 * MiB + 1)  # two chunks, both from the pool
    assert g.mapped == 4 * MiB
    # Refilled, but only with what the capacity still needs: 2 of 4 chunks are mapped.
    assert g.wait_prefetch() == 2
    g.grow(2 * MiB)
    assert g.mapped == 6 * MiB and g.wait_prefetch() == 1  # 3 mapped + 1 pooled = capacity
    g.shrink(6 * MiB)  # everything back into the pool
    assert (g.mapped, g.pool_chunks) == (0, 4)
    g.trim_pool()  # also stops prefetching
    assert (g.prefetch, g.pool_chunks, g.wait_prefetch()) == (0, 0, 0)
    assert g.prefetch_error is None
    g.free()
    # Dropped without free(): its thread ends and its chunks go with it.
    h = _hetmem.growable(ctx, 8 * MiB, chunk=2 * MiB, prefetch=3)
    assert h.wait_prefetch() == 3
    del h
    free = _hetmem.growable(ctx, 8 * MiB, chunk=2 * MiB)
    assert (free.prefetch, free.wait_prefetch()) == (0, 0)
    free.free()
