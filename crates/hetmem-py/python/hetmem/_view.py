"""Zero-copy memoryviews of hetmem memory (the stable ABI of Python 3.9 has no buffer
protocol for extension types, so the view is a ctypes array over the bytes that keeps the
hetmem object alive)."""

import ctypes


def memoryview_of(owner, ptr, size, readonly):
    """A ``memoryview`` (format ``B``) of ``size`` bytes at ``ptr`` that keeps ``owner`` alive."""
    holder = type("hetmem_bytes", (ctypes.c_ubyte * size,), {})
    buf = holder.from_address(ptr)
    buf._hetmem_owner = owner
    view = memoryview(buf).cast("B")
    return view.toreadonly() if readonly else view
