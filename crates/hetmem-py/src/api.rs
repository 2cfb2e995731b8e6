//! The object model and the families: `Runtime` → `Driver` → `Device`s → `Context`s, with
//! reservations, physical memory, mappings, USM allocations, IPC handles and views, managed
//! memory and streams. Each Python method is one call of hetmem's public Rust API (the rule,
//! the error code and its message are hetmem's), run with the GIL released.

// The enumerations keep the specs' spelling (`Access.READWRITE`).
#![allow(non_camel_case_types, clippy::upper_case_acronyms)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyType};

use crate::errors::IntoPyResult;
use crate::memory::{place_of, Memory, Place, Region, RegionKind};

// ---------------------------------------------------------------------------------------
// Enumerations
// ---------------------------------------------------------------------------------------

/// `ze_memory_access_attribute_t`.
#[pyclass(eq, eq_int, frozen, module = "hetmem")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Access {
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_NONE` (0): any access faults.
    NONE = 0,
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE` (1).
    READWRITE = 1,
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY` (2): writes fault.
    READONLY = 2,
}

impl From<hetmem::AccessAttribute> for Access {
    fn from(a: hetmem::AccessAttribute) -> Access {
        match a {
            hetmem::AccessAttribute::None => Access::NONE,
            hetmem::AccessAttribute::ReadWrite => Access::READWRITE,
            hetmem::AccessAttribute::ReadOnly => Access::READONLY,
        }
    }
}

/// An `Access` or its C value (other values: `InvalidEnumerationError`).
fn access_arg(v: &Bound<'_, PyAny>) -> PyResult<hetmem::AccessAttribute> {
    let raw: u32 = if let Ok(a) = v.downcast::<Access>() {
        *a.get() as u32
    } else {
        v.extract()?
    };
    hetmem::AccessAttribute::from_raw(raw).py()
}

/// `ze_memory_type_t`.
#[pyclass(eq, eq_int, frozen, module = "hetmem")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemoryType {
    UNKNOWN = 0,
    HOST = 1,
    DEVICE = 2,
    SHARED = 3,
    HOST_IMPORTED = 4,
}

impl From<hetmem::MemoryType> for MemoryType {
    fn from(m: hetmem::MemoryType) -> MemoryType {
        match m {
            hetmem::MemoryType::Unknown => MemoryType::UNKNOWN,
            hetmem::MemoryType::Host => MemoryType::HOST,
            hetmem::MemoryType::Device => MemoryType::DEVICE,
            hetmem::MemoryType::Shared => MemoryType::SHARED,
            hetmem::MemoryType::HostImported => MemoryType::HOST_IMPORTED,
        }
    }
}

/// `aclrtMemManagedAdviseType`.
#[pyclass(eq, eq_int, frozen, module = "hetmem")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Advice {
    SET_READ_MOSTLY = 0,
    UNSET_READ_MOSTLY = 1,
    SET_PREFERRED_LOCATION = 2,
    UNSET_PREFERRED_LOCATION = 3,
    SET_ACCESSED_BY = 4,
    UNSET_ACCESSED_BY = 5,
}

fn advice_arg(v: &Bound<'_, PyAny>) -> PyResult<hetmem::Advice> {
    let raw: u32 = if let Ok(a) = v.downcast::<Advice>() {
        *a.get() as u32
    } else {
        v.extract()?
    };
    hetmem::Advice::from_raw(raw).py()
}

/// `aclrtMemManagedRangeAttribute` (1..=8).
#[pyclass(eq, eq_int, frozen, module = "hetmem")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RangeAttribute {
    READ_MOSTLY = 1,
    PREFERRED_LOCATION = 2,
    ACCESSED_BY = 3,
    PREFERRED_LOCATION_TYPE = 4,
    PREFERRED_LOCATION_ID = 5,
    LAST_PREFETCH_LOCATION = 6,
    LAST_PREFETCH_LOCATION_TYPE = 7,
    LAST_PREFETCH_LOCATION_ID = 8,
}

const ATTR_NAMES: [&str; 8] = [
    "read_mostly",
    "preferred_location",
    "accessed_by",
    "preferred_location_type",
    "preferred_location_id",
    "last_prefetch_location",
    "last_prefetch_location_type",
    "last_prefetch_location_id",
];

fn attribute_arg(v: &Bound<'_, PyAny>) -> PyResult<hetmem::RangeAttribute> {
    let raw: u32 = if let Ok(a) = v.downcast::<RangeAttribute>() {
        *a.get() as u32
    } else {
        v.extract()?
    };
    hetmem::RangeAttribute::from_raw(raw).py()
}

/// `aclrtMemManagedLocation`: where advice or a prefetch points. Made by `Location.host()`,
/// `Location.device(n)`, `Location.numa(node)`, `Location.numa_current()`,
/// `Location.invalid()`, or `Location(type, id)` from the C values; calls also take `"host"`
/// or a device ordinal (int).
#[pyclass(frozen, eq, module = "hetmem")]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Location {
    inner: hetmem::Location,
}

#[pymethods]
impl Location {
    /// From `struct aclrtMemManagedLocation { type; id; }`.
    ///
    /// Errors: `AclError` 107000 for a type over 4 or a negative id of DEVICE / HOST_NUMA.
    #[new]
    #[pyo3(signature = (r#type, id = 0))]
    fn new(r#type: u32, id: i32) -> PyResult<Location> {
        Ok(Location {
            inner: hetmem::Location::from_raw(r#type, id).py()?,
        })
    }
    #[staticmethod]
    fn host() -> Location {
        Location {
            inner: hetmem::Location::Host,
        }
    }
    #[staticmethod]
    fn device(ordinal: u32) -> Location {
        Location {
            inner: hetmem::Location::Device(ordinal),
        }
    }
    #[staticmethod]
    fn numa(node: u32) -> Location {
        Location {
            inner: hetmem::Location::HostNuma(node),
        }
    }
    #[staticmethod]
    fn numa_current() -> Location {
        Location {
            inner: hetmem::Location::HostNumaCurrent,
        }
    }
    #[staticmethod]
    fn invalid() -> Location {
        Location {
            inner: hetmem::Location::Invalid,
        }
    }
    /// The C `type` value (0 invalid, 1 device, 2 host, 3 host NUMA, 4 host NUMA current).
    #[getter]
    fn r#type(&self) -> u32 {
        match self.inner {
            hetmem::Location::Invalid => 0,
            hetmem::Location::Device(_) => 1,
            hetmem::Location::Host => 2,
            hetmem::Location::HostNuma(_) => 3,
            hetmem::Location::HostNumaCurrent => 4,
        }
    }
    /// The C `id` value (device ordinal or NUMA node; 0 otherwise).
    #[getter]
    fn id(&self) -> u32 {
        match self.inner {
            hetmem::Location::Device(d) | hetmem::Location::HostNuma(d) => d,
            _ => 0,
        }
    }
    fn __repr__(&self) -> String {
        match self.inner {
            hetmem::Location::Invalid => "Location.invalid()".into(),
            hetmem::Location::Device(d) => format!("Location.device({d})"),
            hetmem::Location::Host => "Location.host()".into(),
            hetmem::Location::HostNuma(n) => format!("Location.numa({n})"),
            hetmem::Location::HostNumaCurrent => "Location.numa_current()".into(),
        }
    }
}

fn location_arg(v: Option<&Bound<'_, PyAny>>) -> PyResult<hetmem::Location> {
    let Some(v) = v else {
        return Ok(hetmem::Location::Invalid);
    };
    if v.is_none() {
        return Ok(hetmem::Location::Invalid);
    }
    if let Ok(l) = v.downcast::<Location>() {
        return Ok(l.get().inner);
    }
    if let Ok(d) = v.downcast::<Device>() {
        return Ok(hetmem::Location::Device(d.get().inner.ordinal()));
    }
    if let Ok(s) = v.extract::<String>() {
        return match s.as_str() {
            "host" | "cpu" => Ok(hetmem::Location::Host),
            "numa_current" => Ok(hetmem::Location::HostNumaCurrent),
            _ => Err(PyValueError::new_err(format!(
                "location {s:?} is not \"host\" or \"numa_current\" (use Location.numa(n) or a \
                 device ordinal)"
            ))),
        };
    }
    if let Ok(d) = v.extract::<i64>() {
        let id = i32::try_from(d).map_err(|_| PyValueError::new_err(format!("device {d}")))?;
        return hetmem::Location::from_raw(1, id).py();
    }
    Err(PyTypeError::new_err(
        "a location is a Location, a Device, a device ordinal (int) or \"host\"",
    ))
}

/// An address argument: an int, or any `Memory` (its first byte).
fn ptr_arg(v: &Bound<'_, PyAny>) -> PyResult<usize> {
    if let Ok(m) = v.downcast::<Memory>() {
        return m.getattr("ptr")?.extract();
    }
    v.extract::<usize>().map_err(|_| {
        PyTypeError::new_err("an address is a non-negative int or a hetmem.Memory object")
    })
}

/// A byte count: an int, or a string with a K/M/G/T suffix (`"512M"`).
fn bytes_arg(v: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(n) = v.extract::<u64>() {
        return Ok(n);
    }
    let s: String = v.extract()?;
    hetmem::parse_bytes(&s).py()
}

// ---------------------------------------------------------------------------------------
// Runtime, driver, device
// ---------------------------------------------------------------------------------------

/// The runtime (`zeInit`): holds the driver of the chosen backend. Configured from the
/// environment (`HETMEM_BACKEND`, `HETMEM_HOST_DEVICES`, `HETMEM_HOST_DEVICE_MEMORY`,
/// `HETMEM_HOST_MAX_ALLOC`), then from the arguments given.
///
/// Errors: `InvalidArgumentError` for a bad value (the message names it), 0 devices or 0 bytes;
/// `UninitializedError` for the cuda backend on a machine where it cannot start (the reason).
#[pyclass(frozen, module = "hetmem")]
pub struct Runtime {
    inner: hetmem::Runtime,
}

#[pymethods]
impl Runtime {
    #[new]
    #[pyo3(signature = (backend = None, *, host_devices = None, host_device_memory = None, host_max_alloc_size = None, ipc_max_range_pieces = None))]
    fn new(
        py: Python<'_>,
        backend: Option<&str>,
        host_devices: Option<u32>,
        host_device_memory: Option<&Bound<'_, PyAny>>,
        host_max_alloc_size: Option<&Bound<'_, PyAny>>,
        ipc_max_range_pieces: Option<usize>,
    ) -> PyResult<Runtime> {
        let mut b = hetmem::RuntimeBuilder::from_env().py()?;
        if let Some(k) = backend {
            b = b.backend(hetmem::BackendKind::parse(k).py()?);
        }
        if let Some(n) = host_devices {
            b = b.host_devices(n);
        }
        if let Some(m) = host_device_memory {
            b = b.host_device_memory(bytes_arg(m)?);
        }
        if let Some(m) = host_max_alloc_size {
            b = b.host_max_alloc_size(bytes_arg(m)?);
        }
        if let Some(n) = ipc_max_range_pieces {
            b = b.ipc_max_range_pieces(n);
        }
        let inner = py.detach(|| b.build()).py()?;
        Ok(Runtime { inner })
    }

    /// The driver (`zeDriverGet`: there is one, for the chosen backend).
    #[getter]
    fn driver(&self) -> Driver {
        Driver {
            inner: self.inner.driver().clone(),
        }
    }

    /// `[driver]`.
    fn drivers(&self) -> Vec<Driver> {
        self.inner
            .drivers()
            .into_iter()
            .map(|inner| Driver { inner })
            .collect()
    }

    /// A new context of the driver (as `runtime.driver.create_context()`).
    fn create_context(&self) -> PyResult<Context> {
        Context::make(self.inner.driver())
    }

    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Runtime backend={} devices={}>",
            self.inner.driver().backend_kind().name(),
            self.inner.driver().device_list().len()
        )
    }
}

/// A driver (`ze_driver_handle_t`): one backend and its devices.
#[pyclass(frozen, module = "hetmem")]
pub struct Driver {
    inner: hetmem::Driver,
}

#[pymethods]
impl Driver {
    /// `"host"` or `"cuda"`.
    #[getter]
    fn backend(&self) -> &'static str {
        self.inner.backend_kind().name()
    }
    /// The backend's description (platform, versions).
    fn describe(&self) -> String {
        self.inner.describe()
    }
    /// The devices (`zeDeviceGet`), in ordinal order.
    #[getter]
    fn devices(&self) -> Vec<Device> {
        self.inner
            .devices()
            .into_iter()
            .map(|inner| Device { inner })
            .collect()
    }
    /// Device `ordinal`. Errors: `IndexError`-like `ValueError` if there is none.
    fn device(&self, ordinal: u32) -> PyResult<Device> {
        self.inner
            .device(ordinal)
            .map(|inner| Device { inner })
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "device {ordinal} does not exist ({} devices)",
                    self.inner.device_list().len()
                ))
            })
    }
    /// Creates a context (`zeContextCreate`); everything made in it is released when the last
    /// object of it goes.
    fn create_context(&self) -> PyResult<Context> {
        Context::make(&self.inner)
    }
    /// The host backend's settings (`devices`, `device_memory`, `max_alloc_size`), or `None`.
    fn host_config<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(h) = self.inner.host_config() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("devices", h.devices)?;
        d.set_item("device_memory", h.device_memory)?;
        d.set_item("max_alloc_size", h.max_alloc_size)?;
        Ok(Some(d))
    }
    /// Counters of virtual memory (all contexts).
    fn vm_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.vm_stats();
        let d = PyDict::new(py);
        d.set_item("reservations", s.reservations)?;
        d.set_item("reserved_bytes", s.reserved_bytes)?;
        d.set_item("physical_objects", s.physical_objects)?;
        d.set_item("mapped_runs", s.mapped_runs)?;
        d.set_item("mapped_bytes", s.mapped_bytes)?;
        d.set_item("host_physical_bytes", s.host_physical_bytes)?;
        let devs: Vec<(u64, u64)> = s.devices.iter().map(|u| (u.used, u.capacity)).collect();
        d.set_item("devices", devs)?;
        Ok(d)
    }
    /// Counters of USM allocations and imports (all contexts).
    fn usm_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.usm_stats();
        let d = PyDict::new(py);
        d.set_item("allocations", s.allocations)?;
        d.set_item("allocated_bytes", s.allocated_bytes)?;
        d.set_item("imports", s.imports)?;
        Ok(d)
    }
    /// Counters of IPC: live exports, open views, memory with recorded handle types.
    fn ipc_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.ipc_stats();
        let d = PyDict::new(py);
        d.set_item("exports", s.exports)?;
        d.set_item("views", s.views)?;
        d.set_item("typed_allocations", s.typed_allocations)?;
        d.set_item("typed_physical", s.typed_physical)?;
        Ok(d)
    }
    /// Counters of managed memory (faults, pages and bytes migrated each way).
    fn managed_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.managed_stats();
        let d = PyDict::new(py);
        d.set_item("allocations", s.allocations)?;
        d.set_item("bytes", s.bytes)?;
        d.set_item("host_faults", s.host_faults)?;
        d.set_item("fault_events", s.fault_events)?;
        d.set_item("pages_to_host", s.pages_to_host)?;
        d.set_item("bytes_to_host", s.bytes_to_host)?;
        d.set_item("pages_from_host", s.pages_from_host)?;
        d.set_item("bytes_from_host", s.bytes_from_host)?;
        d.set_item("host_resident_pages", s.host_resident_pages)?;
        let devs: Vec<Bound<'py, PyDict>> = s
            .devices
            .iter()
            .map(|v| {
                let e = PyDict::new(py);
                e.set_item("pages_to_device", v.pages_to_device)?;
                e.set_item("bytes_to_device", v.bytes_to_device)?;
                e.set_item("pages_from_device", v.pages_from_device)?;
                e.set_item("bytes_from_device", v.bytes_from_device)?;
                e.set_item("evictions", v.evictions)?;
                e.set_item("resident_pages", v.resident_pages)?;
                Ok(e)
            })
            .collect::<PyResult<_>>()?;
        d.set_item("devices", devs)?;
        Ok(d)
    }
    /// Most (object, offset, length) pieces one IPC range handle carries.
    #[getter]
    fn ipc_max_range_pieces(&self) -> usize {
        self.inner.ipc_max_range_pieces()
    }
    fn __repr__(&self) -> String {
        format!("<hetmem.Driver {}>", self.inner.backend_kind().name())
    }
}

/// A device (`ze_device_handle_t`).
#[pyclass(frozen, eq, module = "hetmem")]
pub struct Device {
    pub inner: hetmem::Device,
}

impl PartialEq for Device {
    fn eq(&self, o: &Device) -> bool {
        self.inner == o.inner
    }
}

#[pymethods]
impl Device {
    /// 0-based ordinal.
    #[getter]
    fn ordinal(&self) -> u32 {
        self.inner.ordinal()
    }
    /// The backend's name of the device.
    #[getter]
    fn name(&self) -> String {
        self.inner.info().name.clone()
    }
    /// Bytes of memory that physical objects and device allocations count against.
    #[getter]
    fn capacity(&self) -> u64 {
        self.inner.info().capacity
    }
    /// Largest single allocation in bytes.
    #[getter]
    fn max_alloc_size(&self) -> u64 {
        self.inner.info().max_alloc_size
    }
    /// Smallest mapping granularity in bytes.
    #[getter]
    fn min_page_size(&self) -> usize {
        self.inner.info().min_page_size
    }
    /// Bytes of the capacity in use now.
    #[getter]
    fn used_memory(&self) -> u64 {
        self.inner.used_memory()
    }
    /// Bytes free now (`cuMemGetInfo` on a GPU; capacity less used on the host backend).
    fn free_memory(&self) -> PyResult<u64> {
        self.inner.free_memory().py()
    }
    fn __hash__(&self) -> u64 {
        self.inner.ordinal() as u64
    }
    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Device {} {:?} {} bytes>",
            self.inner.ordinal(),
            self.inner.info().name,
            self.inner.info().capacity
        )
    }
}

fn device_arg(
    ctx: &hetmem::Context,
    v: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<hetmem::Device>> {
    let Some(v) = v else { return Ok(None) };
    if v.is_none() {
        return Ok(None);
    }
    if let Ok(d) = v.downcast::<Device>() {
        return Ok(Some(d.get().inner.clone()));
    }
    let n: u32 = v
        .extract()
        .map_err(|_| PyTypeError::new_err("a device is a hetmem.Device or an ordinal (int)"))?;
    ctx.driver().device(n).map(Some).ok_or_else(|| {
        PyValueError::new_err(format!(
            "device {n} does not exist ({} devices)",
            ctx.driver().device_list().len()
        ))
    })
}

fn need_device(ctx: &hetmem::Context, v: Option<&Bound<'_, PyAny>>) -> PyResult<hetmem::Device> {
    Ok(match device_arg(ctx, v)? {
        Some(d) => d,
        None => ctx.driver().device(0).expect("a driver has a device"),
    })
}

// ---------------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------------

/// A context (`ze_context_handle_t`): owns reservations, mappings, physical memory, USM and
/// managed allocations, IPC views. Addresses are ints; any call that takes an address also
/// takes a `Memory` (its first byte).
#[pyclass(frozen, module = "hetmem")]
pub struct Context {
    pub inner: hetmem::Context,
}

impl Context {
    fn make(d: &hetmem::Driver) -> PyResult<Context> {
        Ok(Context {
            inner: d.create_context().py()?,
        })
    }
}

fn new_memory<T: pyo3::PyClass<BaseType = Memory>>(
    py: Python<'_>,
    region: Arc<Region>,
    sub: T,
) -> PyResult<Py<T>> {
    Py::new(
        py,
        PyClassInitializer::from(Memory::whole(region)).add_subclass(sub),
    )
}

#[pymethods]
impl Context {
    /// The driver of this context.
    #[getter]
    fn driver(&self) -> Driver {
        Driver {
            inner: self.inner.driver(),
        }
    }

    /// The page size for reservations and physical memory of `size` bytes on `device`
    /// (`zeVirtualMemQueryPageSize`): 64 KiB below 2 MiB, 2 MiB from 2 MiB up (at least the
    /// device's granularity).
    ///
    /// A size of 0 answers the smallest allocation's page size (the reference driver's answer).
    #[pyo3(signature = (size, device = None))]
    fn query_page_size(&self, size: usize, device: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
        let dev = need_device(&self.inner, device)?;
        self.inner.query_page_size(&dev, size).py()
    }

    /// Reserves `size` bytes of virtual address space (`zeVirtualMemReserve`), aligned to the
    /// page size for `size`, every page NONE. `hint`: an address to try first.
    ///
    /// Errors: `UnsupportedSizeError` for 0 or a size that is not a page multiple;
    /// `OutOfHostMemoryError` when the address space is exhausted.
    #[pyo3(signature = (size, hint = None))]
    fn reserve(
        &self,
        py: Python<'_>,
        size: usize,
        hint: Option<usize>,
    ) -> PyResult<Py<Reservation>> {
        let ctx = self.inner.clone();
        let r = py.detach(|| ctx.reserve(hint, size)).py()?;
        let region = Region::new(
            self.inner.clone(),
            r.base,
            r.size,
            false,
            RegionKind::Reservation,
            None,
        );
        new_memory(py, region.clone(), Reservation { region })
    }

    /// Creates a physical memory object of `size` bytes (`zePhysicalMemCreate`) on `device`
    /// (default device 0), or in host memory with `on_host=True`. `ipc=True` chains the IPC
    /// handle type DEFAULT (`ze_ipc_mem_handle_type_ext_desc_t`).
    ///
    /// Errors: `UnsupportedSizeError` for 0 or not a page multiple; `OutOfDeviceMemoryError`
    /// past the device's capacity.
    #[pyo3(signature = (size, device = None, *, on_host = false, ipc = false))]
    fn create_physical_memory(
        &self,
        py: Python<'_>,
        size: usize,
        device: Option<&Bound<'_, PyAny>>,
        on_host: bool,
        ipc: bool,
    ) -> PyResult<PhysicalMemory> {
        let flags = if on_host {
            hetmem::PhysicalMemoryFlags::AllocateOnHost
        } else {
            hetmem::PhysicalMemoryFlags::AllocateOnDevice
        };
        let dev = if on_host {
            device_arg(&self.inner, device)?
        } else {
            Some(need_device(&self.inner, device)?)
        };
        let ctx = self.inner.clone();
        let p = py
            .detach(|| {
                if ipc {
                    ctx.create_physical_memory_with_ipc_types(
                        dev.as_ref(),
                        flags,
                        size,
                        hetmem::IpcHandleTypes::DEFAULT,
                    )
                } else {
                    ctx.create_physical_memory(dev.as_ref(), flags, size)
                }
            })
            .py()?;
        Ok(PhysicalMemory::new(self.inner.clone(), p))
    }

    /// Maps `[offset, offset + size)` of `phys` at `ptr` with `access` (`zeVirtualMemMap`).
    ///
    /// Errors: `InvalidNullPointerError`; `UnsupportedSizeError` / `UnsupportedAlignmentError`;
    /// `InvalidArgumentError` outside one reservation, over a mapping, or past `phys`;
    /// `InvalidEnumerationError` for an access value over 2.
    #[pyo3(signature = (ptr, size, phys, offset = 0, access = None))]
    fn map(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        size: usize,
        phys: &PhysicalMemory,
        offset: usize,
        access: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let ptr = ptr_arg(ptr)?;
        let a = match access {
            Some(a) => access_arg(a)?,
            None => hetmem::AccessAttribute::ReadWrite,
        };
        let p = phys.inner;
        let ctx = self.inner.clone();
        py.detach(|| ctx.map(ptr, size, p, offset, a)).py()
    }

    /// Unmaps `[ptr, ptr + size)` (`zeVirtualMemUnmap`); the pages revert to NONE.
    ///
    /// Errors: `UnsupportedAlignmentError` / `UnsupportedSizeError`; `InvalidArgumentError`
    /// for pages not mapped.
    fn unmap(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>, size: usize) -> PyResult<()> {
        let ptr = ptr_arg(ptr)?;
        let ctx = self.inner.clone();
        py.detach(|| ctx.unmap(ptr, size)).py()
    }

    /// Sets the access attribute of the mapped pages of `[ptr, ptr + size)`
    /// (`zeVirtualMemSetAccessAttribute`).
    fn set_access_attribute(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        size: usize,
        access: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let ptr = ptr_arg(ptr)?;
        let a = access_arg(access)?;
        let ctx = self.inner.clone();
        py.detach(|| ctx.set_access_attribute(ptr, size, a)).py()
    }

    /// `(Access, length)`: the attribute of the page at `ptr` and how many bytes from `ptr`
    /// (at most `size`) share it (`zeVirtualMemGetAccessAttribute`).
    fn get_access_attribute(
        &self,
        ptr: &Bound<'_, PyAny>,
        size: usize,
    ) -> PyResult<(Access, usize)> {
        let ptr = ptr_arg(ptr)?;
        let (a, n) = self.inner.get_access_attribute(ptr, size).py()?;
        Ok((a.into(), n))
    }

    /// Frees the reservation `[ptr, ptr + size)` (`zeVirtualMemFree`); prefer
    /// `Reservation.free()`.
    fn free(&self, py: Python<'_>, ptr: usize, size: usize) -> PyResult<()> {
        let ctx = self.inner.clone();
        py.detach(|| ctx.free(ptr, size)).py()
    }

    /// Host memory reachable by every device (`zeMemAllocHost`).
    ///
    /// Errors: `UnsupportedSizeError` for 0 or over the largest allocation without
    /// `relaxed_max_size`; `UnsupportedAlignmentError` unless `alignment` is 0 or a power of
    /// two.
    #[pyo3(signature = (size, *, alignment = 0, relaxed_max_size = false, ipc = false))]
    fn alloc_host(
        &self,
        py: Python<'_>,
        size: usize,
        alignment: usize,
        relaxed_max_size: bool,
        ipc: bool,
    ) -> PyResult<Py<Allocation>> {
        let desc = desc(size, alignment, relaxed_max_size, ipc);
        let ctx = self.inner.clone();
        let p = py.detach(|| ctx.alloc_host(&desc)).py()?;
        self.allocation(py, p, size, MemoryType::HOST, None)
    }

    /// Device memory on `device` (`zeMemAllocDevice`; default device 0). On the host backend it
    /// is host-reachable; on cuda it is GPU memory (DLPack / `__cuda_array_interface__`).
    ///
    /// Errors: as `alloc_host`; `OutOfDeviceMemoryError` past the device's capacity.
    #[pyo3(signature = (size, device = None, *, alignment = 0, relaxed_max_size = false, ipc = false))]
    fn alloc_device(
        &self,
        py: Python<'_>,
        size: usize,
        device: Option<&Bound<'_, PyAny>>,
        alignment: usize,
        relaxed_max_size: bool,
        ipc: bool,
    ) -> PyResult<Py<Allocation>> {
        let dev = need_device(&self.inner, device)?;
        let desc = desc(size, alignment, relaxed_max_size, ipc);
        let ctx = self.inner.clone();
        let d2 = dev.clone();
        let p = py.detach(|| ctx.alloc_device(&d2, &desc)).py()?;
        self.allocation(py, p, size, MemoryType::DEVICE, Some(dev.ordinal()))
    }

    /// Shared memory reachable by the host and every device (`zeMemAllocShared`), charged to
    /// `device` if given.
    ///
    /// Errors: as `alloc_device`.
    #[pyo3(signature = (size, device = None, *, alignment = 0, relaxed_max_size = false, ipc = false))]
    fn alloc_shared(
        &self,
        py: Python<'_>,
        size: usize,
        device: Option<&Bound<'_, PyAny>>,
        alignment: usize,
        relaxed_max_size: bool,
        ipc: bool,
    ) -> PyResult<Py<Allocation>> {
        let dev = device_arg(&self.inner, device)?;
        let desc = desc(size, alignment, relaxed_max_size, ipc);
        let ctx = self.inner.clone();
        let d2 = dev.clone();
        let p = py.detach(|| ctx.alloc_shared(d2.as_ref(), &desc)).py()?;
        self.allocation(py, p, size, MemoryType::SHARED, dev.map(|d| d.ordinal()))
    }

    /// Frees a USM allocation by address (`zeMemFree`); prefer `Allocation.free()`.
    fn free_memory(&self, py: Python<'_>, ptr: usize) -> PyResult<()> {
        let ctx = self.inner.clone();
        py.detach(|| ctx.free_memory(ptr)).py()
    }

    /// `zeMemGetAllocProperties` of any address: a dict with `memory_type` (`MemoryType`),
    /// `id`, `page_size`, `device` (ordinal or None), `read_only`, `compression`.
    fn allocation_properties<'py>(
        &self,
        py: Python<'py>,
        ptr: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let p = self.inner.get_allocation_properties(ptr_arg(ptr)?).py()?;
        let d = PyDict::new(py);
        d.set_item("memory_type", MemoryType::from(p.memory_type))?;
        d.set_item("id", p.id)?;
        d.set_item("page_size", p.page_size)?;
        d.set_item("device", p.device)?;
        d.set_item("read_only", p.read_only)?;
        d.set_item(
            "compression",
            p.compression.map(|c| match c {
                hetmem::CompressionHint::Compressed => "compressed",
                hetmem::CompressionHint::Uncompressed => "uncompressed",
            }),
        )?;
        Ok(d)
    }

    /// `(base, size)` of the allocation, import or reservation containing `ptr`
    /// (`zeMemGetAddressRange`).
    ///
    /// Errors: `InvalidNullPointerError`; `UnknownError` for an address in none of them.
    fn address_range(&self, ptr: &Bound<'_, PyAny>) -> PyResult<(usize, usize)> {
        self.inner.get_address_range(ptr_arg(ptr)?).py()
    }

    /// An IPC handle (`zeMemGetIpcHandle`): for the allocation containing `ptr`, the physical
    /// object mapped at `ptr`, or, with `range_size`, every physical object mapped along
    /// `[ptr, ptr + range_size)` as one handle (`ze_ipc_phys_mem_handle_range_ext_desc_t`).
    ///
    /// Errors: `InvalidNullPointerError`; `InvalidArgumentError` for memory with nothing to
    /// share; `InvalidSizeError` for a range of 0; `AddressNotFoundError` naming the first byte
    /// of a range that is not mapped.
    #[pyo3(signature = (ptr, range_size = None))]
    fn get_ipc_handle(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        range_size: Option<usize>,
    ) -> PyResult<IpcHandle> {
        let ptr = ptr_arg(ptr)?;
        let ctx = self.inner.clone();
        let props = hetmem::IpcProperties {
            range_size,
            ..Default::default()
        };
        let h = py
            .detach(|| ctx.get_ipc_handle_with_properties(ptr, &props))
            .py()?;
        Ok(IpcHandle { inner: h })
    }

    /// Opens an IPC handle of this or another process (`zeMemOpenIpcHandle`): a view of the
    /// shared bytes, closed by `IpcMapping.close()` or when it goes.
    ///
    /// Errors: `InvalidArgumentError` for bytes that are not a handle, a put handle, a
    /// vanished exporter; `InvalidEnumerationError` for flags over 0x3.
    #[pyo3(signature = (handle, flags = 0))]
    fn open_ipc_handle(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        flags: u32,
    ) -> PyResult<Py<IpcMapping>> {
        let h = handle_arg(handle)?;
        let ctx = self.inner.clone();
        let ptr = py.detach(|| ctx.open_ipc_handle(&h, flags)).py()?;
        let size = h.size().unwrap_or(0);
        let place = place_of(&self.inner, ptr, false);
        let region = Region::new(
            self.inner.clone(),
            ptr,
            size,
            false,
            RegionKind::Plain,
            Some(place),
        );
        new_memory(py, region.clone(), IpcMapping { region })
    }

    /// Closes the view opened at `ptr` (`zeMemCloseIpcHandle`); prefer `IpcMapping.close()`.
    fn close_ipc_handle(&self, py: Python<'_>, ptr: usize) -> PyResult<()> {
        let ctx = self.inner.clone();
        py.detach(|| ctx.close_ipc_handle(ptr)).py()
    }

    /// Releases what the export of `handle` holds (`zeMemPutIpcHandle`); views already open
    /// stay valid, later opens fail.
    ///
    /// Errors: `InvalidArgumentError` for a handle of another process or context, or put twice.
    fn put_ipc_handle(&self, py: Python<'_>, handle: &Bound<'_, PyAny>) -> PyResult<()> {
        let h = handle_arg(handle)?;
        let ctx = self.inner.clone();
        py.detach(|| ctx.put_ipc_handle(&h)).py()
    }

    /// Imports the physical object a physical-object handle shares as a physical object of this
    /// context (to map into a reservation of one's own).
    #[pyo3(signature = (handle, device = None))]
    fn import_physical_memory(
        &self,
        py: Python<'_>,
        handle: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PhysicalMemory> {
        let h = handle_arg(handle)?;
        let dev = need_device(&self.inner, device)?;
        let ctx = self.inner.clone();
        let p = py.detach(|| ctx.import_physical_memory(&h, &dev)).py()?;
        Ok(PhysicalMemory::new(self.inner.clone(), p))
    }

    /// `size` bytes of managed memory (`aclrtMemAllocManaged`), rounded up to 2 MiB, reachable
    /// from the host and every device, populated on first touch.
    ///
    /// Errors: `AclError` 100000 for 0 or a flag other than `ACL_RT_MEM_ATTACH_GLOBAL`,
    /// 107000 over 3 TiB, 207000 where the platform cannot migrate on faults.
    #[pyo3(signature = (size, flag = hetmem::ACL_RT_MEM_ATTACH_GLOBAL))]
    fn alloc_managed(
        &self,
        py: Python<'_>,
        size: u64,
        flag: u32,
    ) -> PyResult<Py<ManagedAllocation>> {
        let ctx = self.inner.clone();
        let p = py.detach(|| ctx.alloc_managed(size, flag)).py()?;
        let rounded =
            (size as usize).div_ceil(hetmem::MANAGED_PAGE_SIZE) * hetmem::MANAGED_PAGE_SIZE;
        let place = if self.inner.driver().backend_kind() == hetmem::BackendKind::Host {
            Place::Host
        } else {
            Place::CudaManaged
        };
        let region = Region::new(
            self.inner.clone(),
            p,
            rounded,
            false,
            RegionKind::Plain,
            Some(place),
        );
        new_memory(py, region.clone(), ManagedAllocation { region })
    }

    /// Whether `ptr` is inside a live managed allocation of this driver.
    fn is_managed(&self, ptr: &Bound<'_, PyAny>) -> PyResult<bool> {
        Ok(self.inner.is_managed(ptr_arg(ptr)?))
    }

    /// An in-order stream on `device` (`aclrtCreateStream`), for managed prefetches and
    /// stream-ordered copies and fills.
    #[pyo3(signature = (device = None))]
    fn create_stream(&self, py: Python<'_>, device: Option<&Bound<'_, PyAny>>) -> PyResult<Stream> {
        let dev = need_device(&self.inner, device)?;
        let ctx = self.inner.clone();
        let s = py.detach(|| ctx.create_stream(&dev)).py()?;
        Ok(Stream {
            inner: Mutex::new(Some(s)),
            ctx: self.inner.clone(),
        })
    }

    /// Host-synchronous copy of `count` bytes between any two memories hetmem or the process
    /// knows (`aclrtMemcpy`; device memory on a GPU is copied by its device).
    ///
    /// Errors: `AclError` 100000 for null, 107000 for memory not mapped with the access needed.
    fn memcpy(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        count: usize,
    ) -> PyResult<()> {
        let (d, s) = (ptr_arg(dst)?, ptr_arg(src)?);
        let ctx = self.inner.clone();
        // SAFETY: the caller passes memory it owns; hetmem checks both ranges are mapped with
        // the access needed (this is the C contract of aclrtMemcpy).
        py.detach(|| unsafe { ctx.host_memcpy(d, s, count) }).py()
    }

    /// Host-synchronous `aclrtMemset` of `count` bytes at `ptr` to `value`.
    fn memset(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        value: u8,
        count: usize,
    ) -> PyResult<()> {
        let p = ptr_arg(ptr)?;
        let ctx = self.inner.clone();
        // SAFETY: as `memcpy`.
        py.detach(|| unsafe { ctx.host_memset(p, value, count) })
            .py()
    }

    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Context {}>",
            self.inner.driver().backend_kind().name()
        )
    }
}

impl Context {
    fn allocation(
        &self,
        py: Python<'_>,
        ptr: usize,
        size: usize,
        kind: MemoryType,
        device: Option<u32>,
    ) -> PyResult<Py<Allocation>> {
        let place = if self.inner.driver().backend_kind() == hetmem::BackendKind::Host {
            Place::Host
        } else {
            match kind {
                MemoryType::HOST => Place::CudaHost,
                MemoryType::SHARED => Place::CudaManaged,
                _ => Place::CudaDevice(device.unwrap_or(0)),
            }
        };
        let region = Region::new(
            self.inner.clone(),
            ptr,
            size,
            false,
            RegionKind::Plain,
            Some(place),
        );
        new_memory(
            py,
            region.clone(),
            Allocation {
                region,
                kind,
                device,
            },
        )
    }
}

fn desc(size: usize, alignment: usize, relaxed: bool, ipc: bool) -> hetmem::AllocDesc {
    let mut d = hetmem::AllocDesc::new(size)
        .alignment(alignment)
        .relaxed_max_size(relaxed);
    if ipc {
        d = d.ipc_types(hetmem::IpcHandleTypes::DEFAULT);
    }
    d
}

/// Frees what `region` stands for with `f`, once: refused while DLPack exports are alive; on
/// a refusal by hetmem the region stays alive.
fn release(
    py: Python<'_>,
    region: &Region,
    f: impl FnOnce(&hetmem::Context) -> hetmem::Result<()> + Send,
) -> PyResult<()> {
    region.retire()?;
    let ctx = region.ctx.clone();
    match py.detach(|| f(&ctx)) {
        Ok(()) => Ok(()),
        Err(e) => {
            region.alive.store(true, Ordering::Release);
            Err(crate::errors::to_py(e))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Memory objects
// ---------------------------------------------------------------------------------------

/// A virtual-memory reservation (`zeVirtualMemReserve`): `ptr` / `size`, pages NONE until
/// mapped. Exports (`numpy.asarray`, DLPack, …) check every page of the range is mapped with
/// access. Freed by `free()` or when it goes (`zeVirtualMemFree`: unmaps, keeps the physical
/// objects).
#[pyclass(extends = Memory, frozen, module = "hetmem")]
pub struct Reservation {
    region: Arc<Region>,
}

#[pymethods]
impl Reservation {
    /// First address (as `ptr`).
    #[getter]
    fn base(&self) -> usize {
        self.region.ptr
    }
    /// One past the last address.
    #[getter]
    fn end(&self) -> usize {
        self.region.ptr + self.region.size
    }
    /// Maps `size` bytes (default: all of `phys` from `phys_offset`) of `phys` at `offset`
    /// bytes into the reservation with `access` (default READWRITE).
    #[pyo3(signature = (offset, phys, size = None, phys_offset = 0, access = None))]
    fn map(
        &self,
        py: Python<'_>,
        offset: usize,
        phys: &PhysicalMemory,
        size: Option<usize>,
        phys_offset: usize,
        access: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.region.check_alive()?;
        let a = match access {
            Some(a) => access_arg(a)?,
            None => hetmem::AccessAttribute::ReadWrite,
        };
        let size = size.unwrap_or(phys.inner.size.saturating_sub(phys_offset));
        let (ctx, p) = (self.region.ctx.clone(), phys.inner);
        let ptr = self.region.ptr.wrapping_add(offset);
        py.detach(|| ctx.map(ptr, size, p, phys_offset, a)).py()
    }
    /// Unmaps `size` bytes at `offset`.
    fn unmap(&self, py: Python<'_>, offset: usize, size: usize) -> PyResult<()> {
        self.region.check_alive()?;
        let ctx = self.region.ctx.clone();
        let ptr = self.region.ptr.wrapping_add(offset);
        py.detach(|| ctx.unmap(ptr, size)).py()
    }
    /// Sets the access attribute of `size` bytes at `offset`.
    fn set_access(
        &self,
        py: Python<'_>,
        offset: usize,
        size: usize,
        access: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.region.check_alive()?;
        let a = access_arg(access)?;
        let ctx = self.region.ctx.clone();
        let ptr = self.region.ptr.wrapping_add(offset);
        py.detach(|| ctx.set_access_attribute(ptr, size, a)).py()
    }
    /// `(Access, length)` at `offset` (see `Context.get_access_attribute`).
    #[pyo3(signature = (offset = 0, size = None))]
    fn get_access(&self, offset: usize, size: Option<usize>) -> PyResult<(Access, usize)> {
        self.region.check_alive()?;
        let size = size.unwrap_or(self.region.size.saturating_sub(offset));
        let (a, n) = self
            .region
            .ctx
            .get_access_attribute(self.region.ptr.wrapping_add(offset), size)
            .py()?;
        Ok((a.into(), n))
    }
    /// Frees the reservation (unmapping what is mapped; the physical objects stay).
    ///
    /// Errors: `BufferError` while DLPack exports of it live; `ValueError` if already freed.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let (b, s) = (self.region.ptr, self.region.size);
        release(py, &self.region, move |c| c.free(b, s))
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.region.alive.load(Ordering::Acquire) {
            self.free(py)?;
        }
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Reservation {:#x} {} bytes{}>",
            self.region.ptr,
            self.region.size,
            if self.region.alive.load(Ordering::Acquire) {
                ""
            } else {
                " freed"
            }
        )
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.region.alive.swap(false, Ordering::AcqRel) {
            let _ = self.region.ctx.free(self.region.ptr, self.region.size);
        }
    }
}

/// A physical memory object (`zePhysicalMemCreate`): `id`, `size` in bytes. Destroyed by
/// `destroy()` (refused while mapped) or, if unmapped, when it goes.
#[pyclass(frozen, module = "hetmem")]
pub struct PhysicalMemory {
    ctx: hetmem::Context,
    pub inner: hetmem::PhysicalMemory,
    alive: AtomicBool,
}

impl PhysicalMemory {
    fn new(ctx: hetmem::Context, inner: hetmem::PhysicalMemory) -> PhysicalMemory {
        PhysicalMemory {
            ctx,
            inner,
            alive: AtomicBool::new(true),
        }
    }
}

#[pymethods]
impl PhysicalMemory {
    /// Unique id of the object.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id
    }
    /// Size in bytes.
    #[getter]
    fn size(&self) -> usize {
        self.inner.size
    }
    /// Whether the object is still live.
    #[getter]
    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
    /// Destroys the object (`zePhysicalMemDestroy`).
    ///
    /// Errors: `HandleObjectInUseError` while any page of it is mapped (nothing changes).
    fn destroy(&self, py: Python<'_>) -> PyResult<()> {
        if !self.alive.swap(false, Ordering::AcqRel) {
            return Err(PyValueError::new_err(format!(
                "physical memory {} was already destroyed",
                self.inner.id
            )));
        }
        let (ctx, p) = (self.ctx.clone(), self.inner);
        py.detach(|| ctx.destroy_physical_memory(p)).map_err(|e| {
            self.alive.store(true, Ordering::Release);
            crate::errors::to_py(e)
        })
    }
    /// An IPC handle for the whole object.
    fn ipc_handle(&self, py: Python<'_>) -> PyResult<IpcHandle> {
        let (ctx, p) = (self.ctx.clone(), self.inner);
        let h = py
            .detach(|| ctx.get_physical_memory_ipc_handle(p, None))
            .py()?;
        Ok(IpcHandle { inner: h })
    }
    fn __repr__(&self) -> String {
        format!(
            "<hetmem.PhysicalMemory id={} {} bytes>",
            self.inner.id, self.inner.size
        )
    }
}

impl Drop for PhysicalMemory {
    fn drop(&mut self) {
        if self.alive.swap(false, Ordering::AcqRel) {
            // Refused while mapped: the context's teardown releases it then.
            let _ = self.ctx.destroy_physical_memory(self.inner);
        }
    }
}

/// A USM allocation (`zeMemAllocHost` / `Device` / `Shared`): `ptr`, `size`, `type`,
/// `device`. Freed by `free()` or when it goes (`zeMemFree`).
#[pyclass(extends = Memory, frozen, module = "hetmem")]
pub struct Allocation {
    region: Arc<Region>,
    kind: MemoryType,
    device: Option<u32>,
}

#[pymethods]
impl Allocation {
    /// `MemoryType.HOST`, `DEVICE` or `SHARED`.
    #[getter]
    fn r#type(&self) -> MemoryType {
        self.kind
    }
    /// The device ordinal, if any.
    #[getter]
    fn device(&self) -> Option<u32> {
        self.device
    }
    /// Frees the allocation (`zeMemFree`).
    ///
    /// Errors: `BufferError` while DLPack exports of it live; `ValueError` if already freed.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let p = self.region.ptr;
        release(py, &self.region, move |c| c.free_memory(p))
    }
    /// An IPC handle of the allocation (`zeMemGetIpcHandle`).
    fn ipc_handle(&self, py: Python<'_>) -> PyResult<IpcHandle> {
        self.region.check_alive()?;
        let (ctx, p) = (self.region.ctx.clone(), self.region.ptr);
        let h = py.detach(|| ctx.get_ipc_handle(p)).py()?;
        Ok(IpcHandle { inner: h })
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.region.alive.load(Ordering::Acquire) {
            self.free(py)?;
        }
        Ok(())
    }
    fn __repr__(&self) -> String {
        format!(
            "<hetmem.Allocation {:?} {:#x} {} bytes{}>",
            self.kind,
            self.region.ptr,
            self.region.size,
            if self.region.alive.load(Ordering::Acquire) {
                ""
            } else {
                " freed"
            }
        )
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.region.alive.swap(false, Ordering::AcqRel) {
            let _ = self.region.ctx.free_memory(self.region.ptr);
        }
    }
}

/// 64 bytes that share memory with another process (`ze_ipc_mem_handle_t`). Picklable (it is
/// its bytes: `bytes(h)`, `IpcHandle(b)`), so `multiprocessing` can pass it; the exporting
/// process must be alive when it is opened.
#[pyclass(frozen, module = "hetmem")]
pub struct IpcHandle {
    pub inner: hetmem::IpcHandle,
}

fn handle_arg(v: &Bound<'_, PyAny>) -> PyResult<hetmem::IpcHandle> {
    if let Ok(h) = v.downcast::<IpcHandle>() {
        return Ok(h.get().inner);
    }
    if let Ok(b) = v.downcast::<PyBytes>() {
        return IpcHandle::from_slice(b.as_bytes()).map(|h| h.inner);
    }
    Err(PyTypeError::new_err(
        "an IPC handle is a hetmem.IpcHandle or its 64 bytes",
    ))
}

impl IpcHandle {
    fn from_slice(b: &[u8]) -> PyResult<IpcHandle> {
        let data: [u8; 64] = b.try_into().map_err(|_| {
            PyValueError::new_err(format!("an IPC handle is 64 bytes, not {}", b.len()))
        })?;
        Ok(IpcHandle {
            inner: hetmem::IpcHandle::from_bytes(data),
        })
    }
}

#[pymethods]
impl IpcHandle {
    /// The handle from its 64 bytes (any bytes are accepted here; opening checks them).
    #[new]
    fn new(data: &[u8]) -> PyResult<IpcHandle> {
        IpcHandle::from_slice(data)
    }
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.as_bytes())
    }
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyType>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        Ok((
            py.get_type::<IpcHandle>(),
            (PyBytes::new(py, slf.get().inner.as_bytes()),),
        ))
    }
    /// `"allocation"`, `"physical"`, `"range"`, or None for bytes that are not a handle.
    #[getter]
    fn kind(&self) -> Option<&'static str> {
        self.inner.kind().map(|k| match k {
            hetmem::IpcHandleKind::Allocation => "allocation",
            hetmem::IpcHandleKind::Physical => "physical",
            hetmem::IpcHandleKind::Range => "range",
        })
    }
    /// Bytes of the view an open gives, or None.
    #[getter]
    fn size(&self) -> Option<usize> {
        self.inner.size()
    }
    /// The exporter's pid, or None.
    #[getter]
    fn exporter_pid(&self) -> Option<u32> {
        self.inner.exporter_pid()
    }
    /// The fd number in bytes 0..4 (meaningful in the exporter).
    #[getter]
    fn fd(&self) -> i32 {
        self.inner.fd()
    }
    fn __eq__(&self, o: &Bound<'_, PyAny>) -> bool {
        o.downcast::<IpcHandle>()
            .is_ok_and(|h| h.get().inner.as_bytes() == self.inner.as_bytes())
    }
    fn __hash__(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.inner.as_bytes().hash(&mut h);
        h.finish()
    }
    fn __repr__(&self) -> String {
        format!("<hetmem.{:?}>", self.inner)
    }
}

/// A view of another process's memory opened from an IPC handle (`zeMemOpenIpcHandle`).
/// Closed by `close()` or when it goes (`zeMemCloseIpcHandle`).
#[pyclass(extends = Memory, frozen, module = "hetmem")]
pub struct IpcMapping {
    region: Arc<Region>,
}

#[pymethods]
impl IpcMapping {
    /// Closes the view.
    ///
    /// Errors: `BufferError` while DLPack exports of it live; `ValueError` if already closed.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let p = self.region.ptr;
        release(py, &self.region, move |c| c.close_ipc_handle(p))
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.region.alive.load(Ordering::Acquire) {
            self.close(py)?;
        }
        Ok(())
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.region.alive.swap(false, Ordering::AcqRel) {
            let _ = self.region.ctx.close_ipc_handle(self.region.ptr);
        }
    }
}

/// Managed memory (`aclrtMemAllocManaged`): `ptr`, `size` (a multiple of 2 MiB), host- and
/// device-reachable, migrating on access. Freed by `free()` or when it goes (`aclrtFree`).
/// `offset` / `size` arguments are bytes into the allocation (multiples of 2 MiB for advice and
/// prefetch).
#[pyclass(extends = Memory, frozen, module = "hetmem")]
pub struct ManagedAllocation {
    region: Arc<Region>,
}

impl ManagedAllocation {
    fn range(&self, offset: usize, size: Option<usize>) -> PyResult<(usize, usize)> {
        self.region.check_alive()?;
        Ok((
            self.region.ptr.wrapping_add(offset),
            size.unwrap_or(self.region.size.saturating_sub(offset)),
        ))
    }
}

#[pymethods]
impl ManagedAllocation {
    /// Frees the memory; stream work queued on it runs first.
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        let p = self.region.ptr;
        release(py, &self.region, move |c| c.free_managed(p))
    }

    /// `aclrtMemManagedAdvise` on `[offset, offset + size)` (default: all).
    ///
    /// Errors: `AclError` (107000 for a size not a multiple of 2 MiB or a bad location,
    /// 107008 for a misaligned start, 207001 if a device cannot take the pages, …).
    #[pyo3(signature = (advice, location = None, offset = 0, size = None))]
    fn advise(
        &self,
        py: Python<'_>,
        advice: &Bound<'_, PyAny>,
        location: Option<&Bound<'_, PyAny>>,
        offset: usize,
        size: Option<usize>,
    ) -> PyResult<()> {
        let a = advice_arg(advice)?;
        let l = location_arg(location)?;
        let (p, s) = self.range(offset, size)?;
        let ctx = self.region.ctx.clone();
        py.detach(|| ctx.mem_advise(p, s, a, l)).py()
    }

    /// `aclrtMemManagedPrefetchAsync` of `[offset, offset + size)` to `location`, in order on
    /// `stream` (`stream.synchronize()` waits for it and reports its run-time errors).
    #[pyo3(signature = (location, stream, offset = 0, size = None))]
    fn prefetch(
        &self,
        py: Python<'_>,
        location: &Bound<'_, PyAny>,
        stream: &Stream,
        offset: usize,
        size: Option<usize>,
    ) -> PyResult<()> {
        let l = location_arg(Some(location))?;
        let (p, s) = self.range(offset, size)?;
        let ctx = self.region.ctx.clone();
        let g = stream.inner.lock();
        let st = g
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("the stream was closed"))?;
        py.detach(|| ctx.mem_prefetch(p, s, l, 0, st)).py()
    }

    /// One range attribute of `[offset, offset + size)` (`aclrtMemManagedGetAttr`): an int,
    /// or for ACCESSED_BY a list of `slots` ids (padded with -2).
    #[pyo3(signature = (attribute, offset = 0, size = None, slots = 8))]
    fn attribute<'py>(
        &self,
        py: Python<'py>,
        attribute: &Bound<'py, PyAny>,
        offset: usize,
        size: Option<usize>,
        slots: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let a = attribute_arg(attribute)?;
        let (p, s) = self.range(offset, size)?;
        if a == hetmem::RangeAttribute::AccessedBy {
            let v = self.region.ctx.managed_accessed_by(p, s, slots).py()?;
            return Ok(v.into_pyobject(py)?.into_any());
        }
        let v = self.region.ctx.managed_attr_i32(a, p, s).py()?;
        Ok(v.into_pyobject(py)?.into_any())
    }

    /// All eight range attributes of `[offset, offset + size)` as a dict (`read_mostly`,
    /// `preferred_location`, `accessed_by` (a list), `preferred_location_type`,
    /// `preferred_location_id`, `last_prefetch_location`, `last_prefetch_location_type`,
    /// `last_prefetch_location_id`), read together (`aclrtMemManagedGetAttrs`).
    #[pyo3(signature = (offset = 0, size = None, slots = 8))]
    fn attributes<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        size: Option<usize>,
        slots: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (p, s) = self.range(offset, size)?;
        let mut bufs: Vec<Vec<u8>> = hetmem::RangeAttribute::ALL
            .iter()
            .map(|a| {
                vec![
                    0u8;
                    if *a == hetmem::RangeAttribute::AccessedBy {
                        slots.max(1) * 4
                    } else {
                        4
                    }
                ]
            })
            .collect();
        {
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
            self.region
                .ctx
                .managed_get_attrs(&hetmem::RangeAttribute::ALL, p, s, &mut refs)
                .py()?;
        }
        let d = PyDict::new(py);
        for ((a, b), name) in hetmem::RangeAttribute::ALL
            .iter()
            .zip(&bufs)
            .zip(ATTR_NAMES)
        {
            let ints: Vec<i32> = b
                .chunks(4)
                .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if *a == hetmem::RangeAttribute::AccessedBy {
                d.set_item(name, ints)?;
            } else {
                d.set_item(name, ints[0])?;
            }
        }
        Ok(d)
    }

    /// Where the page at `offset` lives now: a dict (`host`, `host_read_only`, `devices`), or
    /// None for a page never touched.
    #[pyo3(signature = (offset = 0))]
    fn residency<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let (p, _) = self.range(offset, None)?;
        let Some(r) = self.region.ctx.managed_residency(p) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("host", r.host)?;
        d.set_item("host_read_only", r.host_read_only)?;
        d.set_item("devices", r.devices)?;
        Ok(Some(d))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.region.alive.load(Ordering::Acquire) {
            self.free(py)?;
        }
        Ok(())
    }
}

impl Drop for ManagedAllocation {
    fn drop(&mut self) {
        if self.region.alive.swap(false, Ordering::AcqRel) {
            let _ = self.region.ctx.free_managed(self.region.ptr);
        }
    }
}

/// An in-order stream on one device (`aclrtStream`). `close()` (or its going) waits for its
/// work.
#[pyclass(frozen, module = "hetmem")]
pub struct Stream {
    inner: Mutex<Option<hetmem::Stream>>,
    #[allow(dead_code)]
    ctx: hetmem::Context,
}

impl Stream {
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&hetmem::Stream) -> hetmem::Result<R> + Send,
    ) -> PyResult<R> {
        let g = self.inner.lock();
        let s = g
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("the stream was closed"))?;
        py.detach(|| f(s)).py()
    }
}

#[pymethods]
impl Stream {
    /// Waits for the stream's work (`aclrtSynchronizeStream`); raises its first run-time error.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |s| s.synchronize())
    }
    /// The device ordinal.
    #[getter]
    fn device(&self) -> PyResult<u32> {
        let g = self.inner.lock();
        g.as_ref()
            .map(|s| s.device().ordinal())
            .ok_or_else(|| PyValueError::new_err("the stream was closed"))
    }
    /// Stream-ordered `aclrtMemcpyAsync` (at least one side managed memory).
    fn memcpy_async(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        count: usize,
    ) -> PyResult<()> {
        let (d, s) = (ptr_arg(dst)?, ptr_arg(src)?);
        self.with(py, |st| st.memcpy_async(d, s, count))
    }
    /// Stream-ordered `aclrtMemsetAsync` of managed memory.
    fn memset_async(
        &self,
        py: Python<'_>,
        ptr: &Bound<'_, PyAny>,
        value: u8,
        count: usize,
    ) -> PyResult<()> {
        let p = ptr_arg(ptr)?;
        self.with(py, |st| st.memset_async(p, value, count))
    }
    /// Waits for the work and destroys the stream (`aclrtDestroyStream`).
    fn close(&self, py: Python<'_>) {
        let s = self.inner.lock().take();
        py.detach(|| drop(s));
    }
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<&Bound<'_, PyAny>>,
        _v: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) {
        self.close(py)
    }
}

/// Adds the classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Access>()?;
    m.add_class::<MemoryType>()?;
    m.add_class::<Advice>()?;
    m.add_class::<RangeAttribute>()?;
    m.add_class::<Location>()?;
    m.add_class::<Runtime>()?;
    m.add_class::<Driver>()?;
    m.add_class::<Device>()?;
    m.add_class::<Context>()?;
    m.add_class::<Memory>()?;
    m.add_class::<Reservation>()?;
    m.add_class::<PhysicalMemory>()?;
    m.add_class::<Allocation>()?;
    m.add_class::<IpcHandle>()?;
    m.add_class::<IpcMapping>()?;
    m.add_class::<ManagedAllocation>()?;
    m.add_class::<Stream>()?;
    m.add("MANAGED_PAGE_SIZE", hetmem::MANAGED_PAGE_SIZE)?;
    m.add("ACL_RT_MEM_ATTACH_GLOBAL", hetmem::ACL_RT_MEM_ATTACH_GLOBAL)?;
    Ok(())
}
