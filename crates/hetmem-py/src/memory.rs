//! `hetmem.Memory`: the base class of every object that is a range of bytes (USM allocations,
//! reservations, opened IPC views, managed allocations, and views of them), and the standard
//! protocols that hand those bytes to frameworks without a copy:
//!
//! - `__array_interface__` (NumPy, version 3) and [`Memory::memoryview`] for memory the host
//!   can reach (every memory of the host backend; pinned host and managed memory on cuda);
//! - `__cuda_array_interface__` (version 3; CuPy, Numba, PyTorch) for memory a GPU can reach
//!   (device, pinned host and managed memory on the cuda backend);
//! - DLPack (`__dlpack__`, `__dlpack_device__`; `torch.from_dlpack`, `numpy.from_dlpack`,
//!   `cupy.from_dlpack`), legacy `dltensor` capsules and versioned (1.0) `dltensor_versioned`
//!   ones when the consumer asks for `max_version >= (1, 0)`. The structures are those of
//!   `dlpack.h` (v1.0), written here.
//!
//! A view shares the bytes; it keeps its owner alive (the Python object holds the Rust one),
//! and every export checks the owner has not been freed. `free()` of an owner while a DLPack
//! capsule of it is alive is refused (`BufferError`); views made through the array interfaces
//! and memoryviews keep the object alive but cannot be counted, so freeing under them is the
//! caller's error (as with any explicitly freed memory).

use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyAttributeError, PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyTuple};

use crate::errors::IntoPyResult;

/// Where the bytes are, as DLPack names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory (every memory of the host backend): `kDLCPU`.
    Host,
    /// GPU memory of device `n`: `kDLCUDA`.
    CudaDevice(u32),
    /// Pinned host memory a GPU reaches (`cuMemHostAlloc`): `kDLCUDAHost`.
    CudaHost,
    /// CUDA managed memory (`cuMemAllocManaged`): `kDLCUDAManaged`.
    CudaManaged,
}

impl Place {
    /// `(DLDeviceType, device id)`.
    pub fn dlpack(self) -> (i32, i32) {
        match self {
            Place::Host => (1, 0),
            Place::CudaDevice(d) => (2, d as i32),
            Place::CudaHost => (3, 0),
            Place::CudaManaged => (13, 0),
        }
    }
    /// Whether the host reaches the bytes through their address.
    pub fn host_reachable(self) -> bool {
        !matches!(self, Place::CudaDevice(_))
    }
    /// Whether a GPU reaches the bytes through their address.
    pub fn cuda_reachable(self) -> bool {
        !matches!(self, Place::Host)
    }
}

/// What kind of memory a region is, for the checks its exports make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Memory accessible in whole while alive (allocations, views, managed memory).
    Plain,
    /// A virtual-memory reservation: exports check that every page of the range is mapped
    /// with access (NONE pages would fault).
    Reservation,
}

/// The bytes an owner object stands for, shared by its views.
#[derive(Debug)]
pub struct Region {
    pub ptr: usize,
    pub size: usize,
    pub readonly: bool,
    pub kind: RegionKind,
    pub ctx: hetmem::Context,
    /// Decided lazily for reservations (what is mapped there), at once otherwise.
    pub place: Mutex<Option<Place>>,
    pub alive: AtomicBool,
    /// DLPack capsules (consumed or not) whose deleter has not run.
    pub dlpack_exports: AtomicUsize,
}

impl Region {
    pub fn new(
        ctx: hetmem::Context,
        ptr: usize,
        size: usize,
        readonly: bool,
        kind: RegionKind,
        place: Option<Place>,
    ) -> Arc<Region> {
        Arc::new(Region {
            ptr,
            size,
            readonly,
            kind,
            ctx,
            place: Mutex::new(place),
            alive: AtomicBool::new(true),
            dlpack_exports: AtomicUsize::new(0),
        })
    }

    pub fn check_alive(&self) -> PyResult<()> {
        if self.alive.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(PyValueError::new_err(format!(
                "the memory at {:#x} ({} bytes) was freed or closed",
                self.ptr, self.size
            )))
        }
    }

    /// Marks the region dead (its owner frees it next). Refused while DLPack capsules of it
    /// are alive.
    pub fn retire(&self) -> PyResult<()> {
        let n = self.dlpack_exports.load(Ordering::Acquire);
        if n > 0 {
            return Err(PyBufferError::new_err(format!(
                "the memory at {:#x} has {n} live DLPack export(s); drop the tensors first",
                self.ptr
            )));
        }
        self.check_alive()?;
        self.alive.store(false, Ordering::Release);
        Ok(())
    }

    pub fn place(&self) -> Place {
        let mut p = self.place.lock();
        if let Some(p) = *p {
            return p;
        }
        let found = place_of(&self.ctx, self.ptr, self.kind == RegionKind::Reservation);
        if self.kind == RegionKind::Plain {
            *p = Some(found);
        }
        found
    }
}

/// Where the memory at `ptr` lives, from hetmem's own records (`reservation`: the address is
/// in a virtual-memory reservation, whose host physical memory a GPU reaches through the
/// mapping only).
pub fn place_of(ctx: &hetmem::Context, ptr: usize, reservation: bool) -> Place {
    if ctx.driver().backend_kind() == hetmem::BackendKind::Host {
        return Place::Host;
    }
    if ctx.is_managed(ptr) {
        return Place::CudaManaged;
    }
    match ctx.get_allocation_properties(ptr) {
        Ok(p) => match p.memory_type {
            hetmem::MemoryType::Host | hetmem::MemoryType::HostImported if !reservation => {
                Place::CudaHost
            }
            hetmem::MemoryType::Shared => Place::CudaManaged,
            _ => Place::CudaDevice(p.device.unwrap_or(0)),
        },
        Err(_) => Place::CudaDevice(0),
    }
}

/// An element type of a view, by its NumPy / PyTorch name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DType {
    pub name: &'static str,
    /// DLPack type code: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool.
    pub code: u8,
    pub bits: u8,
    /// Array-interface typestr, when it has one.
    pub typestr: Option<&'static str>,
}

pub const DTYPES: &[DType] = &[
    DType {
        name: "uint8",
        code: 1,
        bits: 8,
        typestr: Some("|u1"),
    },
    DType {
        name: "int8",
        code: 0,
        bits: 8,
        typestr: Some("|i1"),
    },
    DType {
        name: "uint16",
        code: 1,
        bits: 16,
        typestr: Some("<u2"),
    },
    DType {
        name: "int16",
        code: 0,
        bits: 16,
        typestr: Some("<i2"),
    },
    DType {
        name: "uint32",
        code: 1,
        bits: 32,
        typestr: Some("<u4"),
    },
    DType {
        name: "int32",
        code: 0,
        bits: 32,
        typestr: Some("<i4"),
    },
    DType {
        name: "uint64",
        code: 1,
        bits: 64,
        typestr: Some("<u8"),
    },
    DType {
        name: "int64",
        code: 0,
        bits: 64,
        typestr: Some("<i8"),
    },
    DType {
        name: "float16",
        code: 2,
        bits: 16,
        typestr: Some("<f2"),
    },
    DType {
        name: "float32",
        code: 2,
        bits: 32,
        typestr: Some("<f4"),
    },
    DType {
        name: "float64",
        code: 2,
        bits: 64,
        typestr: Some("<f8"),
    },
    DType {
        name: "bfloat16",
        code: 4,
        bits: 16,
        typestr: None,
    },
    DType {
        name: "bool",
        code: 6,
        bits: 8,
        typestr: Some("|b1"),
    },
];

impl DType {
    pub const U8: DType = DTYPES[0];

    pub fn parse(name: &str) -> PyResult<DType> {
        let n = name.strip_prefix("torch.").unwrap_or(name);
        let n = match n {
            "half" => "float16",
            "float" => "float32",
            "double" => "float64",
            "long" => "int64",
            "int" => "int32",
            "short" => "int16",
            "u1" | "B" => "uint8",
            other => other,
        };
        DTYPES
            .iter()
            .copied()
            .find(|d| d.name == n || d.typestr.is_some_and(|t| &t[1..] == n))
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "dtype {name:?} is not one of: {}",
                    DTYPES.iter().map(|d| d.name).collect::<Vec<_>>().join(", ")
                ))
            })
    }

    pub fn itemsize(self) -> usize {
        self.bits as usize / 8
    }
}

/// A range of bytes: the base class of allocations, reservations, IPC views and managed
/// memory, and what [`Memory::view`] returns.
#[pyclass(subclass, frozen, module = "hetmem")]
pub struct Memory {
    pub region: Arc<Region>,
    pub offset: usize,
    pub len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// The object whose bytes these are (kept alive by the view).
    pub owner: Option<Py<PyAny>>,
}

impl Memory {
    /// The whole region as bytes.
    pub fn whole(region: Arc<Region>) -> Memory {
        let len = region.size;
        Memory {
            region,
            offset: 0,
            len,
            dtype: DType::U8,
            shape: vec![len],
            owner: None,
        }
    }

    fn addr(&self) -> PyResult<usize> {
        self.region.check_alive()?;
        Ok(self.region.ptr + self.offset)
    }

    /// For exports: alive, and for a reservation every page mapped with access.
    fn check_export(&self) -> PyResult<(usize, bool)> {
        let ptr = self.addr()?;
        let mut readonly = self.region.readonly;
        if self.region.kind == RegionKind::Reservation && self.len > 0 {
            let ctx = &self.region.ctx;
            // Access attributes are per base page (the page size for 1 byte).
            let dev = ctx.driver().device(0).expect("a driver has a device");
            let page = ctx.query_page_size(&dev, 1).py()?;
            let start = ptr / page * page;
            let end = (ptr + self.len).div_ceil(page) * page;
            let mut p = start;
            while p < end {
                let (a, n) = ctx.get_access_attribute(p, end - p).py()?;
                match a {
                    hetmem::AccessAttribute::None => {
                        return Err(PyBufferError::new_err(format!(
                            "{:#x} is not mapped with access (NONE): map the pages of \
                             [{ptr:#x}, {:#x}) before exporting them",
                            p.max(ptr),
                            ptr + self.len
                        )))
                    }
                    hetmem::AccessAttribute::ReadOnly => readonly = true,
                    hetmem::AccessAttribute::ReadWrite => {}
                }
                p += n.max(page);
            }
        }
        Ok((ptr, readonly))
    }

    fn shape_tuple<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }
}

/// The holder a DLPack capsule's `manager_ctx` points to.
struct Holder {
    _owner: Py<PyAny>,
    region: Arc<Region>,
    shape: Vec<i64>,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1;
const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

unsafe fn drop_holder(ctx: *mut c_void) {
    if ctx.is_null() {
        return;
    }
    // SAFETY: made by Box::into_raw in `dlpack` below, dropped once (by the one deleter call).
    let h = unsafe { Box::from_raw(ctx as *mut Holder) };
    h.region.dlpack_exports.fetch_sub(1, Ordering::AcqRel);
    // Dropping the owner without the GIL is deferred by PyO3 to when it is next held.
    drop(h);
}

unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: made by Box::into_raw below; the consumer calls the deleter once.
    let t = unsafe { Box::from_raw(p) };
    unsafe { drop_holder(t.manager_ctx) };
}

unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: as `delete_legacy`.
    let t = unsafe { Box::from_raw(p) };
    unsafe { drop_holder(t.manager_ctx) };
}

/// The capsule destructor: a capsule never consumed (still named `dltensor`) deletes its
/// tensor; a consumed one (renamed `used_dltensor`) belongs to its consumer.
unsafe extern "C" fn capsule_legacy(cap: *mut ffi::PyObject) {
    // SAFETY: `cap` is a capsule; IsValid sets no exception.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, LEGACY.as_ptr()) == 1 {
            let p = ffi::PyCapsule_GetPointer(cap, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if !p.is_null() {
                if let Some(d) = (*p).deleter {
                    d(p)
                }
            }
        }
    }
}

unsafe extern "C" fn capsule_versioned(cap: *mut ffi::PyObject) {
    // SAFETY: as `capsule_legacy`.
    unsafe {
        if ffi::PyCapsule_IsValid(cap, VERSIONED.as_ptr()) == 1 {
            let p =
                ffi::PyCapsule_GetPointer(cap, VERSIONED.as_ptr()) as *mut DLManagedTensorVersioned;
            if !p.is_null() {
                if let Some(d) = (*p).deleter {
                    d(p)
                }
            }
        }
    }
}

fn read_bytes(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = data.downcast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = data.downcast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    // Anything else with the buffer protocol (memoryview, numpy arrays, array.array).
    let b = data
        .py()
        .import("builtins")?
        .getattr("bytes")?
        .call1((data,))?;
    Ok(b.downcast::<PyBytes>()?.as_bytes().to_vec())
}

#[pymethods]
impl Memory {
    /// Address of the first byte (an int).
    #[getter]
    fn ptr(&self) -> PyResult<usize> {
        self.addr()
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    /// Size in bytes (as `nbytes`).
    #[getter]
    fn size(&self) -> usize {
        self.len
    }

    /// Whether the bytes may only be read.
    #[getter]
    fn readonly(&self) -> bool {
        self.region.readonly
    }

    /// Whether the memory is still allocated (not freed or closed).
    #[getter]
    fn alive(&self) -> bool {
        self.region.alive.load(Ordering::Acquire)
    }

    /// Element type name of the protocols' exports (`uint8` unless a view chose another).
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name
    }

    /// Shape of the protocols' exports.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        self.shape_tuple(py)
    }

    /// Live DLPack exports of the owner's bytes (capsules whose deleter has not run).
    #[getter]
    fn dlpack_exports(&self) -> usize {
        self.region.dlpack_exports.load(Ordering::Acquire)
    }

    fn __len__(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Memory {:#x} {} bytes {} {:?}{}>",
            self.region.ptr + self.offset,
            self.len,
            self.dtype.name,
            self.shape,
            if self.alive() { "" } else { " freed" }
        )
    }

    /// A view of `size` bytes at `offset` (default: the rest), as `dtype` elements in `shape`
    /// (default: 1-D, `size / itemsize` elements). Shares the bytes; keeps this object alive.
    ///
    /// Errors: `ValueError` for a range past the end, a size that is not a multiple of the
    /// item size, a shape whose product is not the element count, an unknown dtype.
    #[pyo3(signature = (offset = 0, size = None, dtype = "uint8", shape = None))]
    fn view(
        slf: &Bound<'_, Self>,
        offset: usize,
        size: Option<usize>,
        dtype: &str,
        shape: Option<Vec<usize>>,
    ) -> PyResult<Memory> {
        let me = slf.get();
        me.region.check_alive()?;
        let size = size.unwrap_or(me.len.saturating_sub(offset));
        if offset.checked_add(size).is_none_or(|e| e > me.len) {
            return Err(PyValueError::new_err(format!(
                "view [{offset:#x}, +{size:#x}) is past the end of {:#x} bytes",
                me.len
            )));
        }
        let dt = DType::parse(dtype)?;
        if !size.is_multiple_of(dt.itemsize()) {
            return Err(PyValueError::new_err(format!(
                "{size} bytes is not a multiple of {dtype}'s {} bytes",
                dt.itemsize()
            )));
        }
        let n = size / dt.itemsize();
        let shape = shape.unwrap_or_else(|| vec![n]);
        if shape.iter().product::<usize>() != n {
            return Err(PyValueError::new_err(format!(
                "shape {shape:?} does not hold {n} {dtype} elements"
            )));
        }
        Ok(Memory {
            region: me.region.clone(),
            offset: me.offset + offset,
            len: size,
            dtype: dt,
            shape,
            owner: Some(slf.clone().into_any().unbind()),
        })
    }

    /// Copies `size` bytes at `offset` (default: all) into a new `bytes`, through hetmem
    /// (`aclrtMemcpy` semantics: device memory on a GPU is read by a device copy, managed
    /// pages migrate to the host).
    ///
    /// Errors: `ValueError` past the end; the hetmem errors of the copy (e.g. `AclError`
    /// 107000 for pages not mapped readable).
    #[pyo3(signature = (offset = 0, size = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        size: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let base = self.addr()?;
        let size = size.unwrap_or(self.len.saturating_sub(offset));
        if offset.checked_add(size).is_none_or(|e| e > self.len) {
            return Err(PyValueError::new_err(format!(
                "read [{offset:#x}, +{size:#x}) is past the end of {:#x} bytes",
                self.len
            )));
        }
        let mut out = vec![0u8; size];
        if size > 0 {
            let ctx = self.region.ctx.clone();
            let dst = out.as_mut_ptr() as usize;
            // SAFETY: `out` is ours and writable; the source is checked by hetmem.
            py.detach(|| unsafe { ctx.host_memcpy(dst, base + offset, size) })
                .py()?;
        }
        Ok(PyBytes::new(py, &out))
    }

    /// Copies `data` (bytes, bytearray or anything with the buffer protocol) to `offset`.
    ///
    /// Errors: `ValueError` past the end or for read-only memory; the hetmem errors of the
    /// copy.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, offset: usize) -> PyResult<()> {
        let base = self.addr()?;
        if self.region.readonly {
            return Err(PyValueError::new_err("the memory is read-only"));
        }
        let bytes = read_bytes(data)?;
        if offset.checked_add(bytes.len()).is_none_or(|e| e > self.len) {
            return Err(PyValueError::new_err(format!(
                "write of {:#x} bytes at {offset:#x} is past the end of {:#x} bytes",
                bytes.len(),
                self.len
            )));
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let ctx = self.region.ctx.clone();
        // SAFETY: hetmem checks the destination is mapped writable (or device memory).
        py.detach(|| unsafe {
            ctx.host_memcpy(base + offset, bytes.as_ptr() as usize, bytes.len())
        })
        .py()
    }

    /// Sets `size` bytes at `offset` (default: all) to `value` (`aclrtMemset` semantics).
    #[pyo3(signature = (value, offset = 0, size = None))]
    fn fill(&self, py: Python<'_>, value: u8, offset: usize, size: Option<usize>) -> PyResult<()> {
        let base = self.addr()?;
        if self.region.readonly {
            return Err(PyValueError::new_err("the memory is read-only"));
        }
        let size = size.unwrap_or(self.len.saturating_sub(offset));
        if offset.checked_add(size).is_none_or(|e| e > self.len) {
            return Err(PyValueError::new_err(format!(
                "fill [{offset:#x}, +{size:#x}) is past the end of {:#x} bytes",
                self.len
            )));
        }
        let ctx = self.region.ctx.clone();
        // SAFETY: hetmem checks the range is mapped writable (or device memory).
        py.detach(|| unsafe { ctx.host_memset(base + offset, value, size) })
            .py()
    }

    /// A `memoryview` of the bytes, zero-copy (format `B`; read-only for read-only memory),
    /// keeping this object alive. Host-reachable memory only.
    ///
    /// Errors: `BufferError` for memory the host cannot reach (GPU memory), or reservation
    /// pages not mapped with access.
    fn memoryview<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let me = slf.get();
        let (ptr, readonly) = me.check_export()?;
        if !me.region.place().host_reachable() {
            return Err(PyBufferError::new_err(
                "GPU memory is not host-reachable; use __dlpack__ or __cuda_array_interface__",
            ));
        }
        slf.py()
            .import("hetmem._view")?
            .getattr("memoryview_of")?
            .call1((slf, ptr, me.len, readonly))
    }

    /// NumPy's array interface (version 3), for host-reachable memory.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.region.place().host_reachable() {
            return Err(PyAttributeError::new_err(
                "__array_interface__: GPU memory is not host-reachable \
                 (use __cuda_array_interface__ or __dlpack__)",
            ));
        }
        self.interface(py, "__array_interface__")
    }

    /// The CUDA array interface (version 3), for memory a GPU reaches (cuda backend).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if !self.region.place().cuda_reachable() {
            return Err(PyAttributeError::new_err(
                "__cuda_array_interface__: host-backend memory is not GPU memory \
                 (use __array_interface__ or __dlpack__)",
            ));
        }
        self.interface(py, "__cuda_array_interface__")
    }

    /// `(device_type, device_id)` as DLPack numbers them: (1, 0) CPU, (2, n) CUDA device
    /// n, (3, 0) CUDA pinned host, (13, 0) CUDA managed.
    fn __dlpack_device__(&self) -> (i32, i32) {
        self.region.place().dlpack()
    }

    /// A DLPack capsule of the bytes (no copy): `dltensor_versioned` (DLPack 1.0, with the
    /// read-only flag) when `max_version >= (1, 0)`, else the legacy `dltensor`. `stream` is
    /// accepted and needs no synchronisation (hetmem's own work on the memory is complete when
    /// its calls return).
    ///
    /// Errors: `BufferError` for `copy=True`, a `dl_device` other than the memory's, freed
    /// memory, or reservation pages not mapped with access.
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = stream;
        let py = slf.py();
        let me = slf.get();
        let (ptr, readonly) = me.check_export().map_err(|e| {
            if e.is_instance_of::<PyValueError>(py) {
                PyBufferError::new_err(e.value(py).to_string())
            } else {
                e
            }
        })?;
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "hetmem exports its memory without copying (copy=True is not supported)",
            ));
        }
        let (dt, di) = me.region.place().dlpack();
        if let Some(d) = dl_device {
            if d != (dt, di) {
                return Err(PyBufferError::new_err(format!(
                    "the memory is on DLPack device {:?}, not {d:?}",
                    (dt, di)
                )));
            }
        }
        let mut holder = Box::new(Holder {
            _owner: slf.clone().into_any().unbind(),
            region: me.region.clone(),
            shape: me.shape.iter().map(|&s| s as i64).collect(),
        });
        let tensor = DLTensor {
            data: ptr as *mut c_void,
            device: DLDevice {
                device_type: dt,
                device_id: di,
            },
            ndim: holder.shape.len() as i32,
            dtype: DLDataType {
                code: me.dtype.code,
                bits: me.dtype.bits,
                lanes: 1,
            },
            shape: holder.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        me.region.dlpack_exports.fetch_add(1, Ordering::AcqRel);
        let ctx = Box::into_raw(holder) as *mut c_void;
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        // SAFETY: the capsule owns the boxed tensor; its destructor or the consumer deletes it.
        let cap = unsafe {
            if versioned {
                let t = Box::into_raw(Box::new(DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx: ctx,
                    deleter: Some(delete_versioned),
                    flags: if readonly {
                        DLPACK_FLAG_BITMASK_READ_ONLY
                    } else {
                        0
                    },
                    dl_tensor: tensor,
                }));
                let c = ffi::PyCapsule_New(
                    t as *mut c_void,
                    VERSIONED.as_ptr(),
                    Some(capsule_versioned),
                );
                if c.is_null() {
                    delete_versioned(t);
                }
                c
            } else {
                let t = Box::into_raw(Box::new(DLManagedTensor {
                    dl_tensor: tensor,
                    manager_ctx: ctx,
                    deleter: Some(delete_legacy),
                }));
                let c = ffi::PyCapsule_New(t as *mut c_void, LEGACY.as_ptr(), Some(capsule_legacy));
                if c.is_null() {
                    delete_legacy(t);
                }
                c
            }
        };
        // SAFETY: a new reference or null with an exception set.
        unsafe { Bound::from_owned_ptr_or_err(py, cap) }
    }
}

impl Memory {
    fn interface<'py>(&self, py: Python<'py>, which: &str) -> PyResult<Bound<'py, PyDict>> {
        let (ptr, readonly) = self.check_export()?;
        let typestr = self.dtype.typestr.ok_or_else(|| {
            PyAttributeError::new_err(format!(
                "{which}: {} has no array-interface typestr (use __dlpack__)",
                self.dtype.name
            ))
        })?;
        let d = PyDict::new(py);
        d.set_item("shape", self.shape_tuple(py)?)?;
        d.set_item("typestr", typestr)?;
        d.set_item("data", (ptr, readonly))?;
        d.set_item("strides", py.None())?;
        d.set_item("version", 3)?;
        Ok(d)
    }
}
