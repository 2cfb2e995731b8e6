//! Every spec enumeration, flag set and structure-type constant hetmem decodes, in one place:
//! the values of the published Level Zero headers (`ze_api.h`, API 1.17; see
//! `shared/spec/level-zero-facts.md`) and of the CANN ACL headers (`acl_rt.h`), each with its
//! decoder from the raw C value. A C ABI turns its descriptors and `pNext` chains into these
//! types and nothing else; the rules that use them live in the semantics modules.

use crate::error::{AclCode, Error, Result};

/// Page access attribute (`ze_memory_access_attribute_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum AccessAttribute {
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_NONE` (0): inaccessible; any access faults.
    #[default]
    None = 0,
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_READWRITE` (1).
    ReadWrite = 1,
    /// `ZE_MEMORY_ACCESS_ATTRIBUTE_READONLY` (2): writes fault.
    ReadOnly = 2,
}

impl AccessAttribute {
    /// Decodes the C value. Values over READONLY are `InvalidEnumeration`.
    pub fn from_raw(v: u32) -> Result<AccessAttribute> {
        match v {
            0 => Ok(AccessAttribute::None),
            1 => Ok(AccessAttribute::ReadWrite),
            2 => Ok(AccessAttribute::ReadOnly),
            _ => Err(Error::InvalidEnumeration(format!(
                "access attribute {v} is not NONE (0), READWRITE (1) or READONLY (2)"
            ))),
        }
    }
}

/// `ze_physical_mem_flags_t`: where a physical memory object is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PhysicalMemoryFlags {
    /// `ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_DEVICE` (1 << 0, and the default 0).
    #[default]
    AllocateOnDevice,
    /// `ZE_PHYSICAL_MEM_FLAG_ALLOCATE_ON_HOST` (1 << 1).
    AllocateOnHost,
}

impl PhysicalMemoryFlags {
    /// Decodes the C flags: over 0x3 is `InvalidEnumeration`, both bits at once is
    /// `InvalidArgument`.
    pub fn from_raw(v: u32) -> Result<PhysicalMemoryFlags> {
        match v {
            0 | 1 => Ok(PhysicalMemoryFlags::AllocateOnDevice),
            2 => Ok(PhysicalMemoryFlags::AllocateOnHost),
            3 => Err(Error::InvalidArgument(
                "physical memory flags 0x3 ask for both ALLOCATE_ON_DEVICE and ALLOCATE_ON_HOST"
                    .into(),
            )),
            _ => Err(Error::InvalidEnumeration(format!(
                "physical memory flags {v:#x} exceed 0x3"
            ))),
        }
    }
}

/// `ze_memory_type_t`: what kind of memory a pointer points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MemoryType {
    /// `ZE_MEMORY_TYPE_UNKNOWN` (0): not memory this driver knows.
    #[default]
    Unknown = 0,
    /// `ZE_MEMORY_TYPE_HOST` (1): `zeMemAllocHost`.
    Host = 1,
    /// `ZE_MEMORY_TYPE_DEVICE` (2): `zeMemAllocDevice`, or device physical memory mapped in a
    /// virtual-memory reservation.
    Device = 2,
    /// `ZE_MEMORY_TYPE_SHARED` (3): `zeMemAllocShared`.
    Shared = 3,
    /// `ZE_MEMORY_TYPE_HOST_IMPORTED` (4): imported system memory.
    HostImported = 4,
}

/// `ze_memory_compression_hints_ext_flag_t`, one of its two flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompressionHint {
    /// `ZE_MEMORY_COMPRESSION_HINTS_EXT_FLAG_COMPRESSED` (1 << 0).
    Compressed,
    /// `ZE_MEMORY_COMPRESSION_HINTS_EXT_FLAG_UNCOMPRESSED` (1 << 1).
    Uncompressed,
}

impl CompressionHint {
    /// Decodes the descriptor's flags, which must be exactly one flag ("Must be set to one of
    /// the ze_memory_compression_hints_ext_flag_t"). Anything else (0, both bits, other bits) is
    /// `UnsupportedEnumeration`, the reference driver's answer (`prepareL0StructuresLookupTable`).
    pub fn from_raw(flags: u32) -> Result<CompressionHint> {
        match flags {
            1 => Ok(CompressionHint::Compressed),
            2 => Ok(CompressionHint::Uncompressed),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "compression hint flags {flags:#x} are not exactly one of COMPRESSED (0x1) or \
                 UNCOMPRESSED (0x2)"
            ))),
        }
    }

    /// The C flag value.
    pub fn raw(self) -> u32 {
        match self {
            CompressionHint::Compressed => 1,
            CompressionHint::Uncompressed => 2,
        }
    }
}

/// `ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC` (0x10016), the extension form.
pub const RELAXED_LIMITS_EXT_STYPE: u32 = 0x10016;

/// `ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXP_DESC` (0x00020001), the experimental form
/// (same layout: `stype`, `pNext`, `flags`).
pub const RELAXED_LIMITS_EXP_STYPE: u32 = 0x0002_0001;

/// Whether a descriptor chained on an allocation descriptor is relaxed allocation limits, in
/// either form ([`RELAXED_LIMITS_EXT_STYPE`] or [`RELAXED_LIMITS_EXP_STYPE`]); its flags then go
/// to [`relaxed_max_size_from_raw`].
pub fn is_relaxed_limits_stype(stype: u32) -> bool {
    stype == RELAXED_LIMITS_EXT_STYPE || stype == RELAXED_LIMITS_EXP_STYPE
}

/// Decodes `ze_relaxed_allocation_limits_ext_flags_t` (and the experimental form): returns
/// whether MAX_SIZE (1 << 0) is set. Bits over 0x1 are `InvalidEnumeration`; a chained
/// descriptor without MAX_SIZE is `InvalidArgument` (reference driver, `allocHostMem`).
///
/// **flags = 0** is `InvalidArgument`, not "no relaxation": the spec's field text ("must be 0
/// (default) or a valid combination") is the generic wording of every flags field, but the
/// reference driver (intel/compute-runtime: `ContextImp::allocHostMem`,
/// `ContextImp::allocSharedMem`, and `prepareL0StructuresLookupTable` for device allocations)
/// answers a chained relaxed-limits descriptor without `MAX_SIZE` with
/// `ZE_RESULT_ERROR_INVALID_ARGUMENT`. To ask for no relaxation, chain no descriptor.
pub fn relaxed_max_size_from_raw(flags: u32) -> Result<bool> {
    match flags {
        1 => Ok(true),
        0 => Err(Error::InvalidArgument(
            "relaxed allocation limits flags 0x0 lack MAX_SIZE (0x1); chain no descriptor for \
             no relaxation"
                .into(),
        )),
        _ => Err(Error::InvalidEnumeration(format!(
            "relaxed allocation limits flags {flags:#x} exceed 0x1"
        ))),
    }
}

/// Decodes a raw relaxed-allocation-limits descriptor chained on an allocation descriptor
/// (`ze_relaxed_allocation_limits_ext_desc_t` or its experimental form
/// `ze_relaxed_allocation_limits_exp_desc_t`; same layout: `stype`, `pNext`, `flags`) from its
/// `stype` and `flags` fields, for the C ABI; the result goes to
/// [`crate::AllocDesc::relaxed_max_size`].
///
/// - `stype` must be [`RELAXED_LIMITS_EXT_STYPE`] (0x10016) or [`RELAXED_LIMITS_EXP_STYPE`]
///   (0x00020001) ([`is_relaxed_limits_stype`]); any other is `UnsupportedEnumeration`, the
///   reference driver's answer for a chained descriptor it does not know
///   (`prepareL0StructuresLookupTable`);
/// - then the flags as [`relaxed_max_size_from_raw`]: `1` (MAX_SIZE) -> `Ok(true)`; `0` ->
///   `InvalidArgument` (see there: the reference driver's answer, not "no relaxation"); bits
///   over 0x1 -> `InvalidEnumeration`.
///
/// ```
/// use hetmem::usm::relaxed_limits_from_desc;
/// assert_eq!(relaxed_limits_from_desc(0x10016, 1), Ok(true));
/// assert_eq!(relaxed_limits_from_desc(0x0002_0001, 1), Ok(true));
/// assert!(relaxed_limits_from_desc(0x10016, 0).is_err());
/// ```
pub fn relaxed_limits_from_desc(stype: u32, flags: u32) -> Result<bool> {
    if !is_relaxed_limits_stype(stype) {
        return Err(Error::UnsupportedEnumeration(format!(
            "descriptor stype {stype:#x} is neither \
             ZE_STRUCTURE_TYPE_RELAXED_ALLOCATION_LIMITS_EXT_DESC ({RELAXED_LIMITS_EXT_STYPE:#x}) \
             nor its experimental form ({RELAXED_LIMITS_EXP_STYPE:#x})"
        )));
    }
    relaxed_max_size_from_raw(flags)
}

/// `ze_ipc_memory_flags_t` bits (the `flags` of `zeMemOpenIpcHandle`):
/// `ZE_IPC_MEMORY_FLAG_BIAS_CACHED`.
pub const IPC_MEMORY_FLAG_BIAS_CACHED: u32 = 1 << 0;

/// `ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED`.
pub const IPC_MEMORY_FLAG_BIAS_UNCACHED: u32 = 1 << 1;

/// What a handle shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum IpcHandleKind {
    /// A host / device / shared allocation (`zeMemGetIpcHandle` on a USM pointer).
    Allocation = 1,
    /// One physical memory object (a mapped VA, or the object itself).
    Physical = 2,
    /// A VA range of several physical objects (`ze_ipc_phys_mem_handle_range_ext_desc_t`).
    Range = 3,
}

/// `ze_ipc_mem_handle_type_flags_t`, the `typeFlags` of `ze_ipc_mem_handle_type_ext_desc_t`
/// (memory extensions, `ZE_extension_ipc_mem_handle_type`): which handle types memory must
/// support, or which type a get asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandleTypes(u32);

impl IpcHandleTypes {
    /// `ZE_IPC_MEM_HANDLE_TYPE_FLAG_DEFAULT` (1 << 0): an fd-backed handle for this node.
    pub const DEFAULT: IpcHandleTypes = IpcHandleTypes(1);
    /// `ZE_IPC_MEM_HANDLE_TYPE_FLAG_FABRIC_ACCESSIBLE` (1 << 1): shareable over a fabric.
    pub const FABRIC_ACCESSIBLE: IpcHandleTypes = IpcHandleTypes(2);
    /// Both types (0x3): what every backend of this build provides (a fabric-accessible handle
    /// is opened within one machine exactly as a default one).
    pub const ALL: IpcHandleTypes = IpcHandleTypes(3);

    /// Decodes the C flags (`typeFlags`): bits over 0x3 are `InvalidEnumeration` naming the
    /// value; 0 is taken as DEFAULT (the spec is silent; zero-initialised descriptors are
    /// common).
    pub fn from_raw(v: u32) -> Result<IpcHandleTypes> {
        match v {
            0 => Ok(IpcHandleTypes::DEFAULT),
            1..=3 => Ok(IpcHandleTypes(v)),
            _ => Err(Error::InvalidEnumeration(format!(
                "IPC handle type flags {v:#x} exceed DEFAULT | FABRIC_ACCESSIBLE (0x3)"
            ))),
        }
    }
    /// The C flags.
    pub fn raw(self) -> u32 {
        self.0
    }
    /// Whether every type of `other` is in `self`.
    pub fn contains(self, other: IpcHandleTypes) -> bool {
        self.0 & other.0 == other.0
    }
}

/// The chained descriptors of `zeMemGetIpcHandleWithProperties`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IpcProperties {
    /// `ze_ipc_mem_handle_type_ext_desc_t` chained: the handle type asked.
    pub handle_types: Option<IpcHandleTypes>,
    /// `ze_ipc_phys_mem_handle_range_ext_desc_t` chained: the size in bytes of the range
    /// starting at `ptr`.
    pub range_size: Option<usize>,
}

/// The outcome of a query or a wait with a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncStatus {
    /// `ZE_RESULT_SUCCESS`: signalled / finished.
    Ready,
    /// `ZE_RESULT_NOT_READY` (0x1): not yet (the timeout expired first). A success code in
    /// Level Zero, so not an [`Error`].
    NotReady,
}

impl SyncStatus {
    /// The `ze_result_t` value: 0 for `Ready`, 1 for `NotReady`.
    pub fn ze_result(self) -> u32 {
        match self {
            SyncStatus::Ready => 0,
            SyncStatus::NotReady => 1,
        }
    }

    pub(crate) fn of(ready: bool) -> SyncStatus {
        if ready {
            SyncStatus::Ready
        } else {
            SyncStatus::NotReady
        }
    }
}

/// `ze_driver_memory_free_policy_ext_flags_t`: how `zeMemFreeExt` frees memory that queued
/// or running work may still reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FreePolicy {
    /// 0 (default): free now. The pointer is invalid and the device capacity back at once
    /// (unless IPC exports or views of the memory hold it: see [`crate::Context::free_memory`]); if
    /// work still references the memory, its pages stay mapped to it (so no later allocation
    /// can be given that address and the engine never touches anyone else's memory) until that
    /// work finishes, then go.
    Immediate,
    /// `ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_BLOCKING_FREE` (1 << 0): waits until every queued
    /// or running command that references the memory has finished, then frees it.
    Blocking,
    /// `ZE_DRIVER_MEMORY_FREE_POLICY_EXT_FLAG_DEFER_FREE` (1 << 1): returns at once; the
    /// pointer is invalid at once, and the memory and device capacity are released when the
    /// work that references it finishes.
    Defer,
}

impl FreePolicy {
    /// The policies this driver supports, as `ze_driver_memory_free_ext_properties_t`'s
    /// `freePolicies` reports them: BLOCKING_FREE | DEFER_FREE (0x3).
    pub const SUPPORTED: u32 = 0x3;

    /// Decodes the descriptor's `freePolicy`: 0, 1, 2; 3 (both flags) is taken as BLOCKING,
    /// which also meets DEFER's promise that nothing is freed under running work. Values over
    /// 0x3 are `InvalidEnumeration` (the validation layer's `0x3 < freePolicy`).
    pub fn from_raw(flags: u32) -> Result<FreePolicy> {
        match flags {
            0 => Ok(FreePolicy::Immediate),
            1 | 3 => Ok(FreePolicy::Blocking),
            2 => Ok(FreePolicy::Defer),
            _ => Err(Error::InvalidEnumeration(format!(
                "free policy {flags:#x} exceeds 0x3 (BLOCKING_FREE | DEFER_FREE)"
            ))),
        }
    }

    /// `ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC` (0x1000a): the stype of
    /// `ze_memory_free_ext_desc_t`.
    pub const DESC_STYPE: u32 = 0x1000a;

    /// `ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES` (0x10009): the stype of the
    /// driver's free-policy properties, which the conformance suite puts in the free
    /// descriptor; accepted there too.
    pub const PROPERTIES_STYPE: u32 = 0x10009;

    /// Decodes a raw `ze_memory_free_ext_desc_t` (`zeMemFreeExt`'s `pMemFreeDesc`): its `stype`
    /// and `freePolicy` fields, for the C ABI.
    ///
    /// - `free_policy` over 0x3 -> `InvalidEnumeration`, checked first, as the loader's
    ///   parameter-validation layer does (`0x3 < pMemFreeDesc->freePolicy`);
    /// - `stype` must be [`FreePolicy::DESC_STYPE`] (0x1000a) or, as the conformance suite
    ///   sends it, [`FreePolicy::PROPERTIES_STYPE`] (0x10009); any other is `InvalidArgument`,
    ///   the validation layer's answer for a descriptor of the wrong base type
    ///   (`validateStructureTypes`; the reference driver itself does not read `stype`);
    /// - then the policy as [`FreePolicy::from_raw`].
    pub fn from_desc(stype: u32, free_policy: u32) -> Result<FreePolicy> {
        if free_policy > Self::SUPPORTED {
            return FreePolicy::from_raw(free_policy);
        }
        if stype != Self::DESC_STYPE && stype != Self::PROPERTIES_STYPE {
            return Err(Error::InvalidArgument(format!(
                "free descriptor stype {stype:#x} is not ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC \
                 ({:#x})",
                Self::DESC_STYPE
            )));
        }
        FreePolicy::from_raw(free_policy)
    }

    /// The C flag value.
    pub fn raw(self) -> u32 {
        match self {
            FreePolicy::Immediate => 0,
            FreePolicy::Blocking => 1,
            FreePolicy::Defer => 2,
        }
    }
}

/// `ACL_RT_MEM_ATTACH_GLOBAL`, the only flag `aclrtMemAllocManaged` accepts.
pub const ACL_RT_MEM_ATTACH_GLOBAL: u32 = 0x01;

/// `aclrtMemManagedAdviseType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// `SET_READ_MOSTLY` (0): the location is ignored; every page gets a read-only host copy
    /// at once (besides any device copy).
    SetReadMostly,
    /// `UNSET_READ_MOSTLY` (1): the copies collapse to one, writable, at the location (INVALID
    /// means the host).
    UnsetReadMostly,
    /// `SET_PREFERRED_LOCATION` (2). To the host (or a NUMA node), pages not read-mostly: fails
    /// if any is on a device, else every page is populated on the host at once. To device `d`:
    /// fails if any page not read-mostly is on the host or another device, else they are
    /// populated on `d` at once. Read-mostly pages: to the host nothing moves; to a device they
    /// get a read-only copy there. Pages preferring a device are evicted from it last.
    SetPreferredLocation,
    /// `UNSET_PREFERRED_LOCATION` (3): forgets the preference (location ignored).
    UnsetPreferredLocation,
    /// `SET_ACCESSED_BY` (4): records the location; pages whose preferred location is the same
    /// place are populated (mapped) there at once.
    SetAccessedBy,
    /// `UNSET_ACCESSED_BY` (5): removes the location from the record.
    UnsetAccessedBy,
}

impl Advice {
    /// From the ACL value 0..=5.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for any other value.
    pub fn from_raw(v: u32) -> Result<Advice> {
        Ok(match v {
            0 => Advice::SetReadMostly,
            1 => Advice::UnsetReadMostly,
            2 => Advice::SetPreferredLocation,
            3 => Advice::UnsetPreferredLocation,
            4 => Advice::SetAccessedBy,
            5 => Advice::UnsetAccessedBy,
            _ => {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!("advice {v} is not an aclrtMemManagedAdviseType (0..=5)"),
                ))
            }
        })
    }
    /// The ACL value (`aclrtMemManagedAdviseType`, 0..=5).
    pub fn raw(self) -> u32 {
        self as u32
    }
}

/// `aclrtMemManagedLocation`: where advice or a prefetch points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Location {
    /// `ACL_MEM_LOCATIONTYPE_INVALID` (0): only meaningful for `UNSET_READ_MOSTLY` (the host).
    Invalid,
    /// `ACL_MEM_LOCATIONTYPE_DEVICE` (1) with the device id.
    Device(u32),
    /// `ACL_MEM_LOCATIONTYPE_HOST` (2); the id is ignored.
    Host,
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA` (3) with a NUMA node id of this machine.
    HostNuma(u32),
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT` (4): the calling thread's NUMA node, resolved
    /// when the call is made.
    HostNumaCurrent,
}

/// `aclrtMemManagedLocationType` values.
pub mod location_type {
    /// `ACL_MEM_LOCATIONTYPE_INVALID`.
    pub const INVALID: u32 = 0;
    /// `ACL_MEM_LOCATIONTYPE_DEVICE`.
    pub const DEVICE: u32 = 1;
    /// `ACL_MEM_LOCATIONTYPE_HOST`.
    pub const HOST: u32 = 2;
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA`.
    pub const HOST_NUMA: u32 = 3;
    /// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT`.
    pub const HOST_NUMA_CURRENT: u32 = 4;
}

impl Location {
    /// From `struct aclrtMemManagedLocation { type; id; }`. The id is only read for DEVICE and
    /// HOST_NUMA; whether it names a real device / node is checked by the call that uses it.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for a type over 4; `InvalidArgument` (107000)
    /// for a negative id of DEVICE / HOST_NUMA.
    pub fn from_raw(ty: u32, id: i32) -> Result<Location> {
        let nonneg = |what: &str| {
            u32::try_from(id).map_err(|_| {
                Error::Acl(
                    AclCode::RtParamInvalid,
                    format!("{what} id {id} is negative"),
                )
            })
        };
        Ok(match ty {
            location_type::INVALID => Location::Invalid,
            location_type::DEVICE => Location::Device(nonneg("device")?),
            location_type::HOST => Location::Host,
            location_type::HOST_NUMA => Location::HostNuma(nonneg("NUMA node")?),
            location_type::HOST_NUMA_CURRENT => Location::HostNumaCurrent,
            _ => {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!("location type {ty} is not an aclrtMemManagedLocationType (0..=4)"),
                ))
            }
        })
    }
}

/// `aclrtMemManagedRangeAttribute` (values 1..=8; see the English summary of the spec page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RangeAttribute {
    /// 1: 1 if every page of the range is read-mostly, else 0. dataSize 4.
    ReadMostly = 1,
    /// 2: the device / NUMA id every page prefers, -1 if all prefer the host, else -2.
    PreferredLocation = 2,
    /// 3: the ids (device, -1 host, NUMA node) advised `SET_ACCESSED_BY` over the whole range;
    /// extra slots -2, a short buffer gets as many as fit. dataSize a non-zero multiple of 4.
    AccessedBy = 3,
    /// 4: the location type every page prefers, else INVALID. dataSize 4.
    PreferredLocationType = 4,
    /// 5: the device / NUMA id every page prefers, else -2. dataSize 4.
    PreferredLocationId = 5,
    /// 6: where the whole range was last prefetched (requested): id, -1 host, else -2.
    LastPrefetchLocation = 6,
    /// 7: the type of the last prefetch location shared by every page, else INVALID.
    LastPrefetchLocationType = 7,
    /// 8: the id of the last prefetch location shared by every page, else -2.
    LastPrefetchLocationId = 8,
}

impl RangeAttribute {
    /// From the ACL value 1..=8.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for any other value.
    pub fn from_raw(v: u32) -> Result<RangeAttribute> {
        use RangeAttribute::*;
        Ok(match v {
            1 => ReadMostly,
            2 => PreferredLocation,
            3 => AccessedBy,
            4 => PreferredLocationType,
            5 => PreferredLocationId,
            6 => LastPrefetchLocation,
            7 => LastPrefetchLocationType,
            8 => LastPrefetchLocationId,
            _ => {
                return Err(Error::Acl(
                    AclCode::RtParamInvalid,
                    format!("attribute {v} is not an aclrtMemManagedRangeAttribute (1..=8)"),
                ))
            }
        })
    }
    /// All eight, in value order.
    pub const ALL: [RangeAttribute; 8] = [
        RangeAttribute::ReadMostly,
        RangeAttribute::PreferredLocation,
        RangeAttribute::AccessedBy,
        RangeAttribute::PreferredLocationType,
        RangeAttribute::PreferredLocationId,
        RangeAttribute::LastPrefetchLocation,
        RangeAttribute::LastPrefetchLocationType,
        RangeAttribute::LastPrefetchLocationId,
    ];
}

/// The Level Zero flag sets whose bits are checked against their enum (`ze_*_flags_t`): a
/// value with a bit outside the set is `InvalidEnumeration`. One decoder serves every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagSet {
    /// `ze_init_flags_t` (GPU_ONLY, VPU_ONLY).
    Init,
    /// `ze_context_flags_t` (TBD).
    Context,
    /// `ze_host_mem_alloc_flags_t` (cached, uncached, write-combined, initial placement,
    /// read-only).
    HostAlloc,
    /// `ze_device_mem_alloc_flags_t` (cached, uncached, initial placement).
    DeviceAlloc,
    /// `ze_command_queue_flags_t` (explicit only, in order).
    CommandQueue,
    /// `ze_command_list_flags_t` (relaxed ordering … exp cloneable).
    CommandList,
    /// `ze_event_pool_flags_t` (host visible, IPC, kernel timestamp, kernel mapped timestamp).
    EventPool,
    /// `ze_event_scope_flags_t` (subdevice, device, host).
    EventScope,
    /// `ze_fence_flags_t` (signaled).
    Fence,
}

impl FlagSet {
    /// Every bit the set defines.
    pub const fn all(self) -> u32 {
        match self {
            FlagSet::Init => 0x3,
            FlagSet::Context => 0x1,
            FlagSet::HostAlloc => 0x1f,
            FlagSet::DeviceAlloc => 0x7,
            FlagSet::CommandQueue => 0x3,
            FlagSet::CommandList => 0x1f,
            FlagSet::EventPool => 0xf,
            FlagSet::EventScope => 0x7,
            FlagSet::Fence => 0x1,
        }
    }

    /// The C type's name, for messages.
    pub const fn name(self) -> &'static str {
        match self {
            FlagSet::Init => "ze_init_flags_t",
            FlagSet::Context => "ze_context_flags_t",
            FlagSet::HostAlloc => "ze_host_mem_alloc_flags_t",
            FlagSet::DeviceAlloc => "ze_device_mem_alloc_flags_t",
            FlagSet::CommandQueue => "ze_command_queue_flags_t",
            FlagSet::CommandList => "ze_command_list_flags_t",
            FlagSet::EventPool => "ze_event_pool_flags_t",
            FlagSet::EventScope => "ze_event_scope_flags_t",
            FlagSet::Fence => "ze_fence_flags_t",
        }
    }

    /// Decodes `v`: returns it if every bit is in the set.
    ///
    /// Errors: `InvalidEnumeration` naming the value, the set and its bits.
    pub fn check(self, v: u32) -> Result<u32> {
        if v & !self.all() != 0 {
            return Err(Error::InvalidEnumeration(format!(
                "{} {v:#x} has bits outside {:#x}",
                self.name(),
                self.all()
            )));
        }
        Ok(v)
    }
}

/// `ze_memory_advice_t` (`zeCommandListAppendMemAdvise`): 0 (SET_READ_MOSTLY) to 9
/// (CLEAR_SYSTEM_MEMORY_PREFERRED_LOCATION). Advice is a hint: hetmem checks it and keeps
/// memory where every device reaches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryAdvice(u32);

impl MemoryAdvice {
    /// The last value of the enum.
    pub const LAST: u32 = 9;

    /// Decodes the C value.
    ///
    /// Errors: `InvalidEnumeration` for a value past [`MemoryAdvice::LAST`], naming it.
    pub fn from_raw(v: u32) -> Result<MemoryAdvice> {
        if v > Self::LAST {
            return Err(Error::InvalidEnumeration(format!(
                "memory advice {v} is past the last ze_memory_advice_t ({})",
                Self::LAST
            )));
        }
        Ok(MemoryAdvice(v))
    }

    /// The C value.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// `aclrtMemMallocPolicy` of `aclrtMalloc`: a page policy (0..=7, `ACL_MEM_MALLOC_HUGE_FIRST`
/// ... `ACL_MEM_MALLOC_NORMAL_ONLY_P2P`), optionally or-ed with `ACL_MEM_TYPE_LOW_BAND_WIDTH`
/// (0x100), `ACL_MEM_TYPE_HIGH_BAND_WIDTH` (0x1000) and `ACL_MEM_ACCESS_USER_SPACE_READONLY`
/// (0x100000). Every policy places memory the same way in hetmem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MallocPolicy(u32);

impl MallocPolicy {
    /// The bits allowed beside the page policy.
    pub const EXTRA_BITS: u32 = 0x100 | 0x1000 | 0x10_0000;

    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for a page policy over 7 or an unknown bit.
    pub fn from_raw(policy: u32) -> Result<MallocPolicy> {
        if policy & 0xff > 7 || (policy & !0xff) & !Self::EXTRA_BITS != 0 {
            return Err(Error::UnsupportedEnumeration(format!(
                "policy {policy:#x} is not an aclrtMemMallocPolicy (0..=7, optionally with \
                 ACL_MEM_TYPE_LOW_BAND_WIDTH / HIGH_BAND_WIDTH / ACL_MEM_ACCESS_USER_SPACE_READONLY)"
            )));
        }
        Ok(MallocPolicy(policy))
    }
    /// The ACL value.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// `aclrtMemcpyKind` (0..=7, `ACL_MEMCPY_HOST_TO_HOST` ... `ACL_MEMCPY_INTER_DEVICE_TO_DEVICE`).
/// hetmem copies every kind the same way (the pointers decide).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemcpyKind(u32);

impl MemcpyKind {
    /// The highest value, `ACL_MEMCPY_INTER_DEVICE_TO_DEVICE`.
    pub const MAX: u32 = 7;

    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) over 7.
    pub fn from_raw(kind: u32) -> Result<MemcpyKind> {
        if kind > Self::MAX {
            return Err(Error::UnsupportedEnumeration(format!(
                "kind {kind} is not an aclrtMemcpyKind (0..=7)"
            )));
        }
        Ok(MemcpyKind(kind))
    }
    /// The ACL value.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// `aclrtMemAttr` (0..=17): the kind of memory `aclrtGetMemInfo` reports on and
/// `aclrtPhysicalMemProp.memAttr` asks for. Every value answers for the device's one kind of
/// memory in hetmem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemAttr(u32);

impl MemAttr {
    /// The highest value.
    pub const MAX: u32 = 17;

    /// From the ACL value; `what` names the argument in the message (`attr`, `memAttr`).
    ///
    /// Errors: `UnsupportedEnumeration` (107000) over 17.
    pub fn from_raw(v: u32, what: &str) -> Result<MemAttr> {
        if v > Self::MAX {
            return Err(Error::UnsupportedEnumeration(format!(
                "{what} {v} is not an aclrtMemAttr (0..=17)"
            )));
        }
        Ok(MemAttr(v))
    }
    /// The ACL value.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// `aclrtMemHandleType` of physical memory and its exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemHandleType {
    /// `ACL_MEM_HANDLE_TYPE_NONE` (0).
    None,
    /// `ACL_MEM_HANDLE_TYPE_POSIX` (2).
    Posix,
}

impl MemHandleType {
    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for anything but 0 and 2.
    pub fn from_raw(v: u32) -> Result<MemHandleType> {
        match v {
            0 => Ok(MemHandleType::None),
            2 => Ok(MemHandleType::Posix),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "handleType {v} is not an aclrtMemHandleType (NONE 0, POSIX 2)"
            ))),
        }
    }
}

/// `aclrtMemAllocationType`: only `ACL_MEM_ALLOCATION_TYPE_PINNED` (0) exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemAllocationType {
    /// `ACL_MEM_ALLOCATION_TYPE_PINNED` (0).
    Pinned,
}

impl MemAllocationType {
    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for anything but 0.
    pub fn from_raw(v: u32) -> Result<MemAllocationType> {
        match v {
            0 => Ok(MemAllocationType::Pinned),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "allocationType {v} is not ACL_MEM_ALLOCATION_TYPE_PINNED (0)"
            ))),
        }
    }
}

/// `aclrtMemLocationType` of physical memory (`aclrtPhysicalMemProp.location.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PhysLocationType {
    /// `ACL_MEM_LOCATION_TYPE_HOST` (0): host physical memory.
    Host,
    /// `ACL_MEM_LOCATION_TYPE_DEVICE` (1): memory of the device `location.id`.
    Device,
}

impl PhysLocationType {
    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for anything but 0 and 1.
    pub fn from_raw(v: u32) -> Result<PhysLocationType> {
        match v {
            0 => Ok(PhysLocationType::Host),
            1 => Ok(PhysLocationType::Device),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "location.type {v} is not DEVICE (1) or HOST (0) for physical memory"
            ))),
        }
    }
}

/// `aclrtMemGranularityOptions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GranularityOption {
    /// `ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM` (0).
    Minimum,
    /// `ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED` (1).
    Recommended,
}

impl GranularityOption {
    /// From the ACL value.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for anything but 0 and 1.
    pub fn from_raw(v: u32) -> Result<GranularityOption> {
        match v {
            0 => Ok(GranularityOption::Minimum),
            1 => Ok(GranularityOption::Recommended),
            _ => Err(Error::UnsupportedEnumeration(format!(
                "option {v:#x} is not ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM (0) or RECOMMENDED (1)"
            ))),
        }
    }
}

/// `aclrtMemExportFlag` bits: `ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION` (0x1).
pub const ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION: u64 = 0x1;
