//! The C test programs of `tests/c/acl/`, compiled against `crates/hetmem-acl/include` and
//! linked with `-lascendcl`, each run as its own process (see `common`).

mod common;

/// Header test: struct sizes and offsets, enum values, error codes against the published
/// header's numbers.
#[test]
fn c_header_layout_matches_the_published_acl_headers() {
    let out = common::run_ok("header_layout");
    assert!(out.contains("header layout ok"), "{out}");
}

/// The managed-memory cases of `cases/managed.md`, in C.
#[test]
fn c_managed_cases_of_the_cases_file() {
    common::run_managed("managed_cases");
}

/// Set-up calls, per-thread current device and context, error codes and messages, stale and
/// foreign handles, no sticky error.
#[test]
fn c_setup_contexts_errors_and_handles() {
    let out = common::run_ok("setup_errors");
    assert!(out.contains("setup and errors ok"), "{out}");
}

/// Memory calls (every `aclrtMemMallocPolicy`, every `aclrtMemcpyKind`, each error), streams and
/// events ordering work across streams.
#[test]
fn c_memory_streams_and_events() {
    let out = common::run_ok("memory_streams");
    assert!(out.contains("memory and streams ok"), "{out}");
}

/// The eight range attributes over mixed ranges, every `dataSize` rule, `GetAttrs`, advice and
/// prefetch argument errors.
#[test]
fn c_managed_range_attributes_over_mixed_ranges() {
    common::run_managed("managed_attrs");
}

/// ACL virtual memory across real processes: reserve, map, export to a second process (and a
/// process not on the pid list, refused), sleep (unmap, free physical) and wake (re-create,
/// re-map at the same address), and every argument error of the virtual-memory calls.
#[test]
fn c_vmm_export_sleep_and_wake_across_processes() {
    let out = common::run_ok("vmm_sleep_wake");
    assert!(
        out.contains("vmm sleep and wake across processes ok"),
        "{out}"
    );
}

/// Without userfaultfd (a seccomp filter refuses it), managed calls answer 207000 saying why
/// and streams, events and device memory keep working.
#[test]
fn c_without_userfaultfd_managed_is_unsupported_and_the_rest_works() {
    let out = common::run_ok("managed_unsupported");
    assert!(out.contains("managed unsupported ok"), "{out}");
}

/// Managed memory used with streams, device memory, virtual memory and several threads: data
/// stays right through faults, stream copies, fills and prefetches.
#[test]
fn c_managed_memory_with_streams_threads_and_virtual_memory() {
    common::run_managed("managed_streams");
}
