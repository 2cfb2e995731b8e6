"""hetmem for Python: Level Zero virtual memory, USM allocations and IPC, and ACL managed
memory, with their exact semantics, over hetmem's host backend (any Linux machine) and its
cuda backend (NVIDIA GPUs, ``HETMEM_BACKEND=cuda`` or ``Runtime("cuda")``).

>>> import hetmem, numpy
>>> ctx = hetmem.Runtime(host_devices=1, host_device_memory="256M").create_context()
>>> page = ctx.query_page_size(4 << 20)                 # 2 MiB
>>> r = ctx.reserve(2 * page)
>>> phys = ctx.create_physical_memory(page)
>>> r.map(0, phys)                                       # READWRITE
>>> a = numpy.asarray(r.view(0, page))                   # zero-copy, uint8
>>> a[:4] = 7
>>> r.read(0, 4)
b'\\x07\\x07\\x07\\x07'

Errors are :class:`HetmemError` subclasses carrying the spec code (``code``, ``name``,
``ze_result``, ``acl_error``) and hetmem's ``message``.

Memory objects (:class:`Allocation`, :class:`Reservation`, :class:`IpcMapping`,
:class:`ManagedAllocation`, and :meth:`Memory.view` of them) hand their bytes to frameworks
without copying: ``numpy.asarray`` (``__array_interface__``) and :meth:`Memory.memoryview` for
host-reachable memory, ``torch.from_dlpack`` / ``cupy.from_dlpack`` (``__dlpack__``) and
``__cuda_array_interface__`` for GPU memory. PyTorch integration (an allocator over hetmem's
virtual memory, sleep / wake at fixed addresses, growable tensors, one-handle sharing) is in
:mod:`hetmem.torch`, importable where torch is installed.
"""

from ._hetmem import (  # noqa: F401
    ACL_RT_MEM_ATTACH_GLOBAL,
    MANAGED_PAGE_SIZE,
    Access,
    AclError,
    AddressNotFoundError,
    Advice,
    Allocation,
    Context,
    Device,
    Driver,
    HandleObjectInUseError,
    HetmemError,
    InvalidArgumentError,
    InvalidEnumerationError,
    InvalidNullHandleError,
    InvalidNullPointerError,
    InvalidSizeError,
    IpcHandle,
    IpcMapping,
    Location,
    ManagedAllocation,
    Memory,
    MemoryType,
    OutOfDeviceMemoryError,
    OutOfHostMemoryError,
    PhysicalMemory,
    RangeAttribute,
    Reservation,
    Runtime,
    Stream,
    UninitializedError,
    UnknownError,
    UnsupportedAlignmentError,
    UnsupportedEnumerationError,
    UnsupportedFeatureError,
    UnsupportedSizeError,
    __version__,
)

__all__ = [
    "ACL_RT_MEM_ATTACH_GLOBAL",
    "MANAGED_PAGE_SIZE",
    "Access",
    "AclError",
    "AddressNotFoundError",
    "Advice",
    "Allocation",
    "Context",
    "Device",
    "Driver",
    "HandleObjectInUseError",
    "HetmemError",
    "InvalidArgumentError",
    "InvalidEnumerationError",
    "InvalidNullHandleError",
    "InvalidNullPointerError",
    "InvalidSizeError",
    "IpcHandle",
    "IpcMapping",
    "Location",
    "ManagedAllocation",
    "Memory",
    "MemoryType",
    "OutOfDeviceMemoryError",
    "OutOfHostMemoryError",
    "PhysicalMemory",
    "RangeAttribute",
    "Reservation",
    "Runtime",
    "Stream",
    "UninitializedError",
    "UnknownError",
    "UnsupportedAlignmentError",
    "UnsupportedEnumerationError",
    "UnsupportedFeatureError",
    "UnsupportedSizeError",
    "__version__",
]
