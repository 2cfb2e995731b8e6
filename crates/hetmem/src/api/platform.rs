//! Facts about the machine and this process, read by the platform layer: for `hetmem info`,
//! for defaults, and for leak checks in tests and benchmarks (open files, mappings). Reading
//! them changes nothing.

pub use crate::backend::PlatformFacts;

/// The machine's [`PlatformFacts`]: RAM, OS page size, open-file limit, `vm.max_map_count`.
pub fn facts() -> PlatformFacts {
    crate::backend::platform_facts()
}

/// Number of open file descriptors of this process now.
pub fn open_fd_count() -> usize {
    crate::backend::open_fd_count()
}

/// Number of mappings (VMAs) of this process now; each reservation, mapping and allocation
/// adds some, so a return to an earlier count shows nothing leaked.
pub fn mapping_count() -> usize {
    crate::backend::mapping_count()
}

/// The OS page size in bytes (the unit of imports of system memory).
pub fn page_size() -> usize {
    facts().page_size
}

/// The NUMA nodes of this machine (`/sys/devices/system/node/node<N>`), ascending; `[0]` if
/// none is listed. The ids `ACL_MEM_LOCATIONTYPE_HOST_NUMA` accepts. Never fails.
pub fn numa_nodes() -> Vec<u32> {
    crate::backend::numa_nodes()
}

/// The NUMA node of the CPU the calling thread runs on (`getcpu(2)`); 0 if unknown. What
/// `ACL_MEM_LOCATIONTYPE_HOST_NUMA_CURRENT` resolves to when a call is made. Never fails.
pub fn current_numa_node() -> u32 {
    crate::backend::current_numa_node()
}

/// Nanoseconds of the machine's monotonic clock (`CLOCK_MONOTONIC`): the host timestamp of
/// `zeDeviceGetGlobalTimestamps` (every device's timestamp is the host's here). Never fails.
pub fn monotonic_ns() -> u64 {
    crate::backend::monotonic_ns()
}

/// Whether the file at `path` can be opened for reading (`aclInit`'s configuration file, whose
/// contents are not used); `Err` is the OS's reason. Changes nothing.
pub fn check_readable(path: &str) -> std::result::Result<(), String> {
    crate::backend::check_readable(path)
}
