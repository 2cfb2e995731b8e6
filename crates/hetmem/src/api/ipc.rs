//! The public module of this family: its types (from the semantics module of the same name,
//! `crate::semantics::ipc`, where the rules live: its docs list which file holds which) and the
//! calls, as methods of [`crate::Context`] and [`crate::Driver`], each one call into
//! `crate::semantics::ipc`.

use crate::api::runtime::{Context, Device, Driver};
use crate::error::Result;
pub use crate::semantics::ipc::*;
use crate::semantics::usm::AllocDesc;
use crate::semantics::vmm::{PhysicalMemory, PhysicalMemoryFlags};

impl Driver {
    /// The state of this process's IPC broker (peers served now, worker threads alive, and
    /// the broker's bounds), for leak checks.
    pub fn ipc_broker_stats(&self) -> BrokerStats {
        crate::semantics::ipc::broker::stats(&self.shared)
    }

    /// The bare transport under [`Context::open_ipc_handle`]: asks process `pid`'s broker
    /// (started with `nonce`, both read from a handle) about the 64 bytes `request`, accepting
    /// at most `max_payload` bytes and `max_fds` shareable handles, and returns the raw answer.
    /// No handle rule is applied (no decoding, no checks of what comes back): this is the
    /// baseline that benchmarks measure opens against, and a probe for tests of the broker.
    pub fn ipc_broker_request(
        &self,
        pid: u32,
        nonce: u32,
        request: &[u8; 64],
        max_payload: usize,
        max_fds: usize,
    ) -> std::result::Result<BrokerAnswer, TransportError> {
        crate::semantics::ipc::broker::raw_request(
            &self.shared,
            pid,
            nonce,
            request,
            max_payload,
            max_fds,
        )
    }

    /// The name of process `pid`'s IPC broker started with `nonce` (an abstract Unix socket
    /// name on Linux), as error messages give it.
    pub fn ipc_broker_name(&self, pid: u32, nonce: u32) -> String {
        crate::semantics::ipc::broker::name(&self.shared, pid, nonce)
    }

    /// Counters of this driver's IPC state: live exports, open views, and memory with recorded
    /// handle types. Not a Level Zero call. Takes the driver's locks for reading; never fails.
    pub fn ipc_stats(&self) -> IpcStats {
        crate::semantics::ipc::registry::stats(&self.shared)
    }

    /// Most `(physical object, offset, length)` pieces one range handle of this driver carries
    /// ([`crate::RuntimeBuilder::ipc_max_range_pieces`]; default
    /// [`DEFAULT_MAX_RANGE_PIECES`]). Not a Level Zero call.
    pub fn ipc_max_range_pieces(&self) -> usize {
        crate::semantics::ipc::export::max_range_pieces(&self.shared)
    }
}

impl Context {
    /// `zeMemGetIpcHandle`: a handle for the allocation containing `ptr` (any byte of it; the
    /// view is the allocation's page-rounded size in bytes), or for the whole physical object
    /// mapped at `ptr` in a reservation. Every get of the same memory returns the same handle
    /// (one export, counting its gets); each needs one [`Context::put_ipc_handle`].
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for a pointer in no allocation
    /// of this context and no mapped page, or in imported system memory; as
    /// [`Context::get_ipc_handle_with_properties`] otherwise. Nothing changes on error.
    pub fn get_ipc_handle(&self, ptr: usize) -> Result<IpcHandle> {
        crate::semantics::ipc::export::get(self.d(), self.id(), ptr, &IpcProperties::default())
    }

    /// `zeMemGetIpcHandleWithProperties`: as [`Context::get_ipc_handle`], with the chained
    /// handle-type descriptor and / or range descriptor (`props.range_size`: the handle then
    /// captures every physical object mapped along `[ptr, ptr+size)`, in address order; the
    /// importer's view is `size` bytes and starts at the byte `ptr` names).
    ///
    /// Handle types (`props.handle_types`, case 11 of `shared/cases/level-zero.md`): DEFAULT
    /// and FABRIC_ACCESSIBLE are both supported on every backend, within one machine (the same
    /// handle, opened by another process of the machine as a default one); without a
    /// handle-type descriptor no type is asked. Support is reported by the extension
    /// `ZE_extension_ipc_mem_handle_type` (the spec has no IPC property flag for it).
    ///
    /// Errors: `InvalidNullPointer` for null; `UnsupportedFeature` for a handle type the memory
    /// was not created with (memory created with a handle-type descriptor of DEFAULT only and
    /// asked for FABRIC_ACCESSIBLE, or the reverse); `InvalidArgument` for a pointer in no allocation of this context and no
    /// mapped page, or imported system memory. With a range (any start byte, any size: the
    /// handle shares the whole pages it touches and the importer's pointer is that of the
    /// range's first byte): `InvalidSize` for size 0, `InvalidArgument` for a range past the
    /// end of the address space or if memory that is not reserved VA overlaps the range (a
    /// USM allocation or import, a managed allocation, an opened IPC view),
    /// `AddressNotFound` naming the first byte not mapped to a physical object (an unmapped
    /// page of a reservation, or an address hetmem does not know), `UnsupportedSize` past
    /// [`Driver::ipc_max_range_pieces`] pieces, `UnsupportedFeature` if a physical object in
    /// the range was created with handle types that do not include the asked ones. Nothing
    /// changes on error (no export, no fd, no broker traffic).
    ///
    /// Units: `ptr` is an address, `props.range_size` bytes; the handle's view size
    /// ([`IpcHandle::size`]) is the allocation's page-rounded span, the whole physical object,
    /// or exactly the range size.
    pub fn get_ipc_handle_with_properties(
        &self,
        ptr: usize,
        props: &IpcProperties,
    ) -> Result<IpcHandle> {
        crate::semantics::ipc::export::get(self.d(), self.id(), ptr, props)
    }

    /// A handle for the whole physical memory object `phys` (`phys.size` bytes; the importer's
    /// view is the whole object, whether or not it is mapped anywhere).
    ///
    /// Spec: Level Zero 1.18 has no IPC call that takes a `ze_physical_mem_handle_t` (the
    /// handle is used by `zePhysicalMemGetProperties`, `zePhysicalMemDestroy` and
    /// `zeVirtualMemMap` only); this is issue 4's "IPC handle for a physical memory object",
    /// with the rules of `zeMemGetIpcHandleWithProperties` on a pointer into a mapping of the
    /// object (which exports the same thing) and the handle-type descriptor
    /// `ze_ipc_mem_handle_type_ext_desc_t` (memory extensions; chained at `zePhysicalMemCreate`,
    /// see [`Context::create_physical_memory_with_ipc_types`]). The spec's nearest route is
    /// `zePhysicalMemGetProperties` with `ze_external_memory_export_fd_t` plus
    /// `zeMemGetIpcHandleFromFileDescriptorExp`.
    ///
    /// Errors: `InvalidArgument` for an object that is not live in this context;
    /// `InvalidEnumeration` / `UnsupportedFeature` for handle types as
    /// [`Context::get_ipc_handle_with_properties`] (a type not chained at creation). Nothing changes on error.
    pub fn get_physical_memory_ipc_handle(
        &self,
        phys: PhysicalMemory,
        handle_types: Option<IpcHandleTypes>,
    ) -> Result<IpcHandle> {
        crate::semantics::ipc::export::physical(self.d(), self.id(), phys.id, handle_types)
    }

    /// `zeMemOpenIpcHandle`: maps what `handle` shares into a fresh range of this process and
    /// returns its start. Works in any process of the exporter's uid, the exporter included;
    /// every call gives a new pointer. `flags` are `ze_ipc_memory_flags_t` (BIAS_CACHED,
    /// BIAS_UNCACHED: accepted, no effect on the host backend). The view stays valid until
    /// [`Context::close_ipc_handle`], even if the exporter frees the memory or exits.
    ///
    /// Units: the view is the handle's size in bytes ([`IpcHandle::size`]), aligned to the
    /// driver's page size for that size.
    ///
    /// Errors: `InvalidEnumeration` for flags over 0x3; `InvalidArgument` for bytes that are
    /// not a handle, a handle that was put or whose context is gone, a wrong token, a vanished
    /// exporter (for a handle the fd transport cannot serve), a received fd that is not a
    /// sealed memfd large enough; `UnsupportedSize` for a range handle claiming more pieces
    /// than this driver's [`Driver::ipc_max_range_pieces`]; `OutOfHostMemory` if the OS
    /// refuses. Nothing changes on error (no view, no fd kept).
    pub fn open_ipc_handle(&self, handle: &IpcHandle, flags: u32) -> Result<usize> {
        crate::semantics::ipc::import::open(self.d(), self.id(), handle, flags)
    }

    /// Imports the physical memory object a physical-object handle shares (from
    /// [`Context::get_physical_memory_ipc_handle`], in this or another process) as a physical
    /// object of this context, to be mapped with [`Context::map`] wherever the caller reserved
    /// address space and released with [`Context::destroy_physical_memory`] (ACL's
    /// `aclrtMemImportFromShareableHandle`, CUDA's `cuMemImportFromShareableHandle`; Level
    /// Zero has no such call). The object is `handle.size()` bytes, on `device` if the exported
    /// memory was device memory (else host memory). An import of this process's own memory
    /// holds that memory's device charge, so it counts against the device until the last
    /// import and export of it are gone, after the original is destroyed; an import of
    /// another process's memory is charged to no capacity here (the exporter's process
    /// counts it). It stays valid, and so do its mappings, after the exporter
    /// destroys its object or exits. Transports as [`Context::open_ipc_handle`] (the exporter
    /// must be alive unless the handle's fd is valid here).
    ///
    /// Errors: `InvalidArgument` for bytes that are not a handle, a handle of an allocation or
    /// a range (not one physical object), a handle that was put, a wrong token, a vanished
    /// exporter, a received shareable handle this backend cannot import or too small;
    /// `InvalidNullHandle` for a device of another driver; `OutOfHostMemory` if the OS refuses.
    /// Nothing changes on error.
    pub fn import_physical_memory(
        &self,
        handle: &IpcHandle,
        device: &Device,
    ) -> Result<PhysicalMemory> {
        crate::semantics::ipc::import::import_physical(
            self.d(),
            self.id(),
            handle,
            (&device.shared, device.ordinal()),
        )
    }

    /// `zeMemCloseIpcHandle`: unmaps the view that [`Context::open_ipc_handle`] returned at
    /// `ptr`. No fd stays open for a view, so nothing else is released. Blocks until no queued
    /// or running copy or fill references the view (waiting with no lock held).
    ///
    /// Errors: `InvalidNullPointer` for null; `InvalidArgument` for a pointer that is not the
    /// start of an open view of this context (interior pointers, closed views, other
    /// contexts' views, any other memory). Nothing changes on error.
    pub fn close_ipc_handle(&self, ptr: usize) -> Result<()> {
        crate::semantics::ipc::import::close(self.d(), self.id(), ptr)
    }

    /// `zeMemPutIpcHandle`: returns one get of `handle` (any context of the exporting driver
    /// may put it). Gets of the same memory return the same handle and count on one export;
    /// the last put releases what the export holds (its fds; the memory goes once nothing else
    /// holds it). Views already opened stay valid; opens after the last put fail.
    ///
    /// A handle [`Context::ipc_handle_from_fd`] made for memory another process exported
    /// holds nothing here: its put is `Ok` and changes nothing (the reference driver's answer:
    /// compute-runtime's `ContextImp::putIpcMemHandle` answers `ZE_RESULT_SUCCESS` for a handle
    /// that is not one of its exports; the header lists no code for it; case 5 of
    /// `shared/cases/level-zero.md`).
    ///
    /// Errors: `InvalidArgument` for bytes that are not a handle (forged, corrupted), any other
    /// handle exported by another process or driver, one put as often as it was got, or one
    /// whose context is gone. Nothing changes on error.
    pub fn put_ipc_handle(&self, handle: &IpcHandle) -> Result<()> {
        crate::semantics::ipc::import::put(self.d(), handle)
    }

    /// `zeMemGetIpcHandleFromFileDescriptorExp`: the IPC handle for `fd`, a file descriptor of
    /// this process (as `zeMemGetFileDescriptorFromIpcHandleExp` gave it, or as received from
    /// the exporting process with `SCM_RIGHTS`, the 64 bytes not sent), with `fd` in bytes 0..4.
    ///
    /// Host backend (a memfd identifies its memory): if `fd` is the shareable handle of a live
    /// export of this context (same identity as the export's first handle), the handle is that
    /// export's. Otherwise it describes the memory behind `fd` alone: kind allocation, memory
    /// type device, no exporter (pid 0, so opening it never contacts a broker), view size the
    /// memory's size; opening it maps `fd` through the fd transport, which checks it again.
    ///
    /// cuda backend (its shareable fds, descriptors of `/dev/nvidiactl`, identify nothing): the
    /// fd of a handle is the export's description, a sealed memfd holding the handle, made at
    /// export and closed at its last put; the handle is read back from it and opens through
    /// the exporter's broker (the exporter must be alive).
    ///
    /// A handle made for memory another process exported holds nothing here:
    /// [`Context::put_ipc_handle`] of it is `Ok` and changes nothing (case 5 of
    /// `shared/cases/level-zero.md`).
    ///
    /// Errors: `InvalidArgument` for a negative fd, an fd that is not open, not a shareable
    /// handle this backend imports (on the host: a memfd sealed against grow and shrink), or
    /// empty; on cuda, an fd that is not an export's description (a sealed memfd of 64 bytes
    /// that decode as a hetmem handle). Nothing changes (no fd is kept or closed).
    pub fn ipc_handle_from_fd(&self, fd: i32) -> Result<IpcHandle> {
        crate::semantics::ipc::import::handle_from_fd(self.d(), self.id(), fd)
    }

    /// `zeMemAllocDevice` with `ze_ipc_mem_handle_type_ext_desc_t` chained: the same as
    /// [`Context::alloc_device`] with [`AllocDesc::ipc_types`] set, recording the handle types
    /// the memory must support.
    ///
    /// The types are kept on the allocation's record (under the same lock as the allocation,
    /// so no get can see it without them) and go with it ([`IpcStats::typed_allocations`]).
    /// Units, alignment: as [`Context::alloc_device`].
    ///
    /// DEFAULT and FABRIC_ACCESSIBLE are supported on every backend (within one machine; case
    /// 11 of `shared/cases/level-zero.md`): a later get asking for a type not given here is
    /// `UnsupportedFeature`.
    ///
    /// Errors: as [`Context::alloc_device`] (decode C flags with [`IpcHandleTypes::from_raw`]:
    /// `InvalidEnumeration` over 0x3, before anything is allocated).
    pub fn alloc_device_with_ipc_types(
        &self,
        device: &Device,
        desc: &AllocDesc,
        types: IpcHandleTypes,
    ) -> Result<usize> {
        self.alloc_device(device, &desc.ipc_types(types))
    }

    /// `zeMemAllocHost` with `ze_ipc_mem_handle_type_ext_desc_t` chained: as
    /// [`Context::alloc_host`] (units, alignment), recording the handle types on the
    /// allocation's record as [`Context::alloc_device_with_ipc_types`] does.
    ///
    /// Errors: as [`Context::alloc_host`].
    pub fn alloc_host_with_ipc_types(
        &self,
        desc: &AllocDesc,
        types: IpcHandleTypes,
    ) -> Result<usize> {
        self.alloc_host(&desc.ipc_types(types))
    }

    /// `zePhysicalMemCreate` with `ze_ipc_mem_handle_type_ext_desc_t` chained: as
    /// [`Context::create_physical_memory`], recording the handle types on the object's record
    /// (under the same lock; they go with the object, [`IpcStats::typed_physical`]). Units:
    /// `size` in bytes, as [`Context::create_physical_memory`].
    ///
    /// DEFAULT and FABRIC_ACCESSIBLE are supported (within one machine).
    ///
    /// Errors: as [`Context::create_physical_memory`].
    pub fn create_physical_memory_with_ipc_types(
        &self,
        device: Option<&Device>,
        flags: PhysicalMemoryFlags,
        size: usize,
        types: IpcHandleTypes,
    ) -> Result<PhysicalMemory> {
        crate::semantics::ipc::export::create_physical_with_types(
            self.d(),
            self.id(),
            device.map(Device::dref),
            flags,
            size,
            types,
        )
    }
}
