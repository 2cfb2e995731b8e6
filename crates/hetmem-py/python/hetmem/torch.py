"""hetmem for PyTorch (importable where torch is installed).

- :func:`allocator` / :func:`region`: a pluggable CUDA allocator over hetmem's virtual memory
  (``torch.cuda.memory.CUDAPluggableAllocator`` over the C entry points ``hetmem_torch_malloc``
  / ``hetmem_torch_free`` of hetmem's extension module), used through ``torch.cuda.MemPool``:
  PyTorch's caching allocator asks hetmem for whole segments. Every segment is one
  exportable physical object mapped at addresses carved from the arena of the current tag.
- :func:`sleep` / :func:`wake`: the memory allocated inside ``with region(tag):`` is released
  (``offload=True``: copied to pinned host memory first; ``False``: discarded) and restored at
  the same virtual addresses: tensors, their ``data_ptr()`` and CUDA graphs that captured them
  stay valid.
- :class:`GrowableTensor`: a tensor over a reservation of its maximum size, grown and shrunk in
  chunks from a pool; ``data_ptr()`` never changes (KV caches).
- :func:`share` / :func:`open_shared`: a tagged region's tensors sent to another process with
  one IPC range handle; the receiver gets tensors over the same bytes.

Example::

    import torch, hetmem.torch as ht
    with ht.region("weights"):
        model = torch.nn.Linear(4096, 4096, device="cuda")
    ht.sleep("weights")                  # GPU memory released, bytes in pinned host memory
    ht.wake("weights")                   # same addresses, same bytes
"""

import contextlib
import threading
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from . import _hetmem

__all__ = [
    "allocator",
    "init",
    "region",
    "use_as_default_allocator",
    "sleep",
    "wake",
    "blocks",
    "owns",
    "stats",
    "last_error",
    "context",
    "GrowableTensor",
    "SharedRegion",
    "share",
    "unshare",
    "open_shared",
]

_lock = threading.Lock()
_allocator = None
_pools: Dict[Tuple[str, int], "torch.cuda.MemPool"] = {}


def init(backend: Optional[str] = None, arena_size: Optional[int] = None) -> str:
    """Starts hetmem's allocator (default backend: cuda); returns the backend's name."""
    return _hetmem.torch_init(backend, arena_size)


def context() -> "_hetmem.Context":
    """The hetmem context the allocator runs in."""
    return _hetmem.torch_context()


def allocator() -> "torch.cuda.memory.CUDAPluggableAllocator":
    """The pluggable allocator over hetmem (made once)."""
    global _allocator
    with _lock:
        if _allocator is None:
            init()
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                _hetmem.__file__, "hetmem_torch_malloc", "hetmem_torch_free"
            )
        return _allocator


def use_as_default_allocator() -> None:
    """Makes hetmem the process's CUDA allocator (every tensor a block of its own, no caching
    above it). Must run before the first CUDA allocation; :func:`region` is the usual way."""
    torch.cuda.memory.change_current_allocator(allocator())


def _pool(tag: str, device: int) -> "torch.cuda.MemPool":
    key = (tag, device)
    if key not in _pools:
        _pools[key] = torch.cuda.MemPool(allocator().allocator())
    return _pools[key]


@contextlib.contextmanager
def region(tag: str = "default", device: Optional[int] = None) -> Iterator[None]:
    """Allocations on ``device`` (default: the current one) made inside come from hetmem,
    tagged ``tag`` (one ``torch.cuda.MemPool`` per tag and device)."""
    dev = torch.cuda.current_device() if device is None else int(device)
    pool = _pool(tag, dev)
    prev = _hetmem.torch_set_tag(tag)
    try:
        with torch.cuda.use_mem_pool(pool, device=dev):
            yield
    finally:
        _hetmem.torch_set_tag(prev)


def _tags(tags) -> Optional[List[str]]:
    if not tags:
        return None
    return [t for t in tags]


def sleep(*tags: str, offload: bool = True) -> Tuple[int, int]:
    """Releases the GPU memory of the tags' blocks (all blocks for no tag), keeping their
    addresses; ``offload`` copies the bytes to pinned host memory first. Waits for the device
    first (``torch.cuda.synchronize``). Returns ``(blocks, bytes)``."""
    torch.cuda.synchronize()
    return _hetmem.torch_sleep(_tags(tags), offload)


def wake(*tags: str, keep_host_copy: bool = True) -> Tuple[int, int]:
    """Restores the tags' sleeping blocks at the same addresses (the offloaded bytes copied
    back). ``keep_host_copy=False`` frees the pinned copies (the next sleep makes them
    again). Returns ``(blocks, bytes)``."""
    return _hetmem.torch_wake(_tags(tags), keep_host_copy)


def blocks(tag: Optional[str] = None):
    """The live blocks: ``(ptr, size, device, tag, asleep)`` in address order."""
    return _hetmem.torch_blocks(tag)


def owns(t) -> bool:
    """Whether tensor (or address) ``t`` lies in memory of hetmem's allocator."""
    p = t.data_ptr() if hasattr(t, "data_ptr") else int(t)
    return _hetmem.torch_block_of(p) is not None


def stats() -> dict:
    """The allocator's counters."""
    return _hetmem.torch_stats()


def last_error() -> Optional[str]:
    """Why the allocator's last call failed (a NULL from malloc), if it did."""
    return _hetmem.torch_last_error()


_DTYPES = {
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
    torch.bool: "bool",
}


def _device_index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    return d.index if d.index is not None else torch.cuda.current_device()


class GrowableTensor:
    """A 1-D tensor of ``dtype`` over a reservation of ``max_numel`` elements: grown and shrunk
    in ``chunk_bytes`` chunks (default 64 MiB) from a pool, its ``data_ptr()`` never changes.
    ``tensor`` is the first ``numel`` elements; only those may be touched.

    A chunk is made (``cuMemCreate``) when growth needs one and the pool is empty; chunks given
    back by :meth:`shrink` / :meth:`resize`, or made ahead by :meth:`fill_pool`, are only
    mapped again. A growth step that stays inside the last mapped chunk makes no driver call.
    ``prefetch_chunks`` > 0 starts a thread that keeps that many chunks made ahead in the pool
    (never more than the capacity still needs; up to that many chunks of device memory held
    beyond ``mapped_bytes``), so growth only maps while the chunks are made beside it."""

    def __init__(
        self,
        max_numel: int,
        dtype=torch.float16,
        device=None,
        chunk_bytes: int = 64 << 20,
        ctx=None,
        prefetch_chunks: int = 0,
    ):
        self.dtype = dtype
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        dev = _device_index(device)
        self._ctx = ctx if ctx is not None else context()
        self._buf = _hetmem.growable(
            self._ctx, max_numel * self.itemsize, chunk_bytes, dev, self.itemsize, prefetch_chunks
        )
        cap = self._buf.capacity // self.itemsize
        view = self._buf.view(0, cap * self.itemsize, dtype=_DTYPES[dtype])
        self._full = torch.from_dlpack(view)
        # The growth step is the extension's method itself: one call, no Python frame.
        self.grow = self._buf.grow_items

    @property
    def numel(self) -> int:
        """Elements backed (the length of ``tensor``)."""
        return self._buf.used // self.itemsize

    @property
    def capacity(self) -> int:
        """Elements the reservation holds."""
        return self._full.numel()

    @property
    def mapped_bytes(self) -> int:
        return self._buf.mapped

    @property
    def pool_chunks(self) -> int:
        return self._buf.pool_chunks

    def data_ptr(self) -> int:
        return self._full.data_ptr()

    @property
    def tensor(self) -> "torch.Tensor":
        """The first ``numel`` elements (a view: same storage, same ``data_ptr()``)."""
        return self._full[: self.numel]

    def resize(self, numel: int) -> None:
        """Backs exactly ``numel`` elements (mapping chunks from the pool, or unmapping the ones
        past it back into the pool). ``tensor`` is then that long; the address never changes.

        Errors: ``UnsupportedSizeError`` past the capacity."""
        self._buf.resize(numel * self.itemsize)

    def grow(self, numel: int) -> int:  # replaced per instance by the extension's grow_items
        """Backs ``numel`` more elements (see :meth:`resize`); returns the new ``numel``."""
        return self._buf.grow_items(numel)

    def shrink(self, numel: int) -> None:
        """Backs ``numel`` fewer elements (at least 0)."""
        self.resize(max(0, self.numel - numel))

    def fill_pool(self, nbytes: int) -> None:
        """Makes chunks ahead of time (growth then only maps them)."""
        self._buf.fill_pool(nbytes)

    def trim_pool(self) -> None:
        """Destroys the pooled chunks and stops prefetching."""
        self._buf.trim_pool()

    def wait_prefetch(self) -> int:
        """Waits until the prefetch thread has its chunks made; returns the chunks pooled."""
        return self._buf.wait_prefetch()


class SharedRegion:
    """What :func:`share` sends: one IPC range handle for a tag's span and where each named
    tensor lies in it. Picklable."""

    def __init__(self, handle: bytes, size: int, entries: Dict[str, tuple]):
        self.handle = handle
        self.size = size
        self.entries = entries

    def __reduce__(self):
        return (SharedRegion, (self.handle, self.size, self.entries))


def share(tensors: Dict[str, "torch.Tensor"], tag: str, device: Optional[int] = None) -> SharedRegion:
    """One IPC range handle for the span of ``tag`` on ``device`` and the layout of
    ``tensors`` (each must lie in that span): the trainer -> inference-engine case.

    Errors: ``ValueError`` for a tensor outside the span; ``AddressNotFoundError`` if the span
    has a gap (a freed or sleeping block)."""
    dev = _device_index(device)
    torch.cuda.synchronize(dev)
    h, base, size = _hetmem.torch_share(tag, dev)
    entries = {}
    for name, t in tensors.items():
        p = t.data_ptr()
        if not (base <= p < base + size):
            raise ValueError(f"tensor {name!r} at {p:#x} is not in the span of tag {tag!r}")
        entries[name] = (
            p - base,
            tuple(t.shape),
            tuple(t.stride()),
            str(t.dtype).replace("torch.", ""),
            t.untyped_storage().nbytes() if t.numel() else 0,
        )
    return SharedRegion(bytes(h), size, entries)


def unshare(shared: SharedRegion) -> None:
    """Releases what the export of ``shared`` holds in this process (``zeMemPutIpcHandle``):
    views already opened stay valid, later opens fail."""
    context().put_ipc_handle(shared.handle)


def open_shared(shared: SharedRegion, ctx=None, device: Optional[int] = None):
    """Opens a :class:`SharedRegion` in this process: ``(mapping, {name: tensor})``, the
    tensors over the shared bytes (no copy). Keep ``mapping`` (or the tensors) alive while
    they are used; ``mapping.close()`` unmaps."""
    ctx = ctx if ctx is not None else context()
    view = ctx.open_ipc_handle(shared.handle)
    flat = torch.from_dlpack(view)
    if device is not None and flat.device.index != _device_index(device):
        raise ValueError(f"the view is on {flat.device}, not {device}")
    out = {}
    for name, (off, shape, stride, dtype, _) in shared.entries.items():
        dt = getattr(torch, dtype)
        item = torch.empty((), dtype=dt).element_size()
        span = (max((s - 1) * st for s, st in zip(shape, stride)) + 1) * item if shape else item
        if any(s == 0 for s in shape):
            out[name] = torch.empty(shape, dtype=dt, device=flat.device)
            continue
        piece = flat[off : off + span].view(dt)
        out[name] = torch.as_strided(piece, shape, stride)
    return view, out
