//! One test per rule of device queues, command lists, events and fences (issue 3, "Device
//! queues and events"), on the backend under test (`HETMEM_BACKEND`). Device memory is read and
//! written through the `dev_*` helpers (the runtime's own copies on cuda, where the host cannot
//! reach it). The tests whose point is two queues run their second queue on device 1 where there
//! is one and on device 0 otherwise (one GPU); the ones whose point is two devices need two.

mod common;

use common::{dev_bytes, dev_put, on_cuda, runtime_with, task_count};

use common::ze::{INVALID_ARGUMENT, INVALID_ENUMERATION, INVALID_NULL_POINTER, INVALID_SIZE};

use std::time::{Duration, Instant};

use hetmem::{AccessAttribute, AllocDesc, Context, Device, PhysicalMemoryFlags, Runtime};
use hetmem::{CommandList, FreePolicy, SyncStatus, MAX_FILL_PATTERN_SIZE};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const FOREVER: u64 = u64::MAX;

/// Two devices of `capacity` bytes on the host backend (the machine's GPUs on cuda), device 0
/// and a context.
fn setup1(capacity: u64) -> (Runtime, Device, Context) {
    let rt = runtime_with(2, capacity);
    let d0 = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    (rt, d0, ctx)
}

/// [`setup1`] and a second device: device 1, or on a machine of one device (one GPU) device 0
/// again, after a loud line. For the tests whose point is a second queue (events, barriers and
/// copies between queues), which a second queue on the same device carries as well.
fn setup(capacity: u64) -> (Runtime, Device, Device, Context) {
    let (rt, d0, ctx) = setup1(capacity);
    let d1 = match rt.driver().device(1) {
        Some(d) => d,
        None => {
            common::loud(&format!(
                "NOTE ({}) {}: one device here; the second device's queue is a second queue on \
                 device 0",
                common::backend().name(),
                common::test_name()
            ));
            d0.clone()
        }
    };
    (rt, d0, d1, ctx)
}

/// Device 1 after a check that the runtime has two devices (a loud not-applicable line and
/// `None` where it has one).
fn second_device(rt: &Runtime) -> Option<Device> {
    if common::fewer_devices_than(rt, 2) {
        return None;
    }
    rt.driver().device(1)
}

/// Writes `n` bytes of `v` at `p` (device memory: the runtime's copies on cuda).
fn dev_set(ctx: &Context, p: usize, v: u8, n: usize) {
    dev_put(ctx, p, &vec![v; n]);
}

/// Whether the `n` bytes at `p` (device memory) are all `v`.
fn dev_all(ctx: &Context, p: usize, n: usize, v: u8) -> bool {
    dev_bytes(ctx, p, n).iter().all(|&b| b == v)
}

/// Zeroes `[p, p+n)` on cuda, where fresh memory is not zero-filled (the host backend's is, and
/// the tests that rely on it keep doing so there): device memory through the runtime's copies,
/// memory the host reaches directly.
fn zero_on_cuda(ctx: &Context, p: usize, n: usize, host_reachable: bool) {
    if !on_cuda() {
        return;
    }
    if host_reachable {
        // SAFETY: live host-reachable memory of `n` bytes, as the caller says.
        unsafe { bytes(p, n) }.fill(0);
    } else {
        dev_set(ctx, p, 0, n);
    }
}

fn code<T: std::fmt::Debug>(r: hetmem::Result<T>) -> u32 {
    r.expect_err("expected an error").ze_result()
}

/// # Safety: `[p, p+n)` is live host-accessible memory.
unsafe fn bytes<'a>(p: usize, n: usize) -> &'a mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
}

/// A page-aligned heap buffer (for imports).
struct HeapPages {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}
impl HeapPages {
    fn new(size: usize) -> HeapPages {
        let layout = std::alloc::Layout::from_size_align(size, 64 * KIB).unwrap();
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null());
        HeapPages { ptr, layout }
    }
    fn addr(&self) -> usize {
        self.ptr as usize
    }
}
impl Drop for HeapPages {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// A mapped, read-write virtual-memory range of `size` bytes on `dev`; returns its base.
fn vm_buffer(ctx: &Context, dev: &Device, size: usize) -> usize {
    let page = ctx.query_page_size(dev, size).unwrap();
    let size = size.next_multiple_of(page);
    let r = ctx.reserve(None, size).unwrap();
    let phys = ctx
        .create_physical_memory(Some(dev), PhysicalMemoryFlags::AllocateOnDevice, size)
        .unwrap();
    ctx.map(r.base, size, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    r.base
}

fn closed_list(ctx: &Context, dev: &Device, f: impl FnOnce(&CommandList)) -> CommandList {
    let l = ctx.create_command_list(dev).unwrap();
    f(&l);
    l.close().unwrap();
    l
}

#[test]
fn commands_of_one_queue_run_in_order() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(256 << 20);
    let n = 64 * KIB;
    let buf = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let outs: Vec<usize> = (0..32)
        .map(|_| ctx.alloc_host(&AllocDesc::new(n)).unwrap())
        .collect();
    let q = ctx.create_command_queue(&d0).unwrap();
    // fill buf with i, copy it to outs[i], then the next i: each copy must see the fill just
    // before it and none after.
    let l = closed_list(&ctx, &d0, |l| {
        for (i, &o) in outs.iter().enumerate() {
            l.append_memory_fill(buf, &[i as u8 + 1], n, None, &[])
                .unwrap();
            l.append_memory_copy(o, buf, n, None, &[]).unwrap();
        }
    });
    q.execute_command_lists(&[&l], None).unwrap();
    // A second batch on the same queue runs after the first.
    let l2 = closed_list(&ctx, &d0, |l| {
        l.append_memory_fill(buf, &[0xEE], n, None, &[]).unwrap()
    });
    q.execute_command_lists(&[&l2], None).unwrap();
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    for (i, &o) in outs.iter().enumerate() {
        let b = unsafe { bytes(o, n) };
        assert!(b.iter().all(|&x| x == i as u8 + 1), "copy {i} out of order");
    }
    assert!(dev_all(&ctx, buf, n, 0xEE));
}

#[test]
fn copies_between_every_pair_of_memory_kinds_carry_the_bytes() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(256 << 20);
    let n = 128 * KIB;
    let half = n / 2;
    let heap = HeapPages::new(n);
    // Device 1's memory where there is a device 1; the VM mapping is on the last device.
    let d1 = if rt.driver().device_list().len() >= 2 {
        rt.driver().device(1)
    } else {
        common::part_not_applicable_on(
            hetmem::BackendKind::Cuda,
            "the copies to and from a second device's memory: this machine has one GPU",
        );
        None
    };
    let last = d1.clone().unwrap_or_else(|| d0.clone());
    let mut kinds: Vec<(&str, usize)> = vec![
        ("host", ctx.alloc_host(&AllocDesc::new(n)).unwrap()),
        (
            "device0",
            ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap(),
        ),
    ];
    if let Some(d1) = &d1 {
        kinds.push(("device1", ctx.alloc_device(d1, &AllocDesc::new(n)).unwrap()));
    }
    kinds.extend([
        (
            "shared",
            ctx.alloc_shared(Some(&d0), &AllocDesc::new(n)).unwrap(),
        ),
        (
            "imported",
            ctx.import_system_memory(heap.addr(), n, false).unwrap(),
        ),
        ("vm-mapping", vm_buffer(&ctx, &last, n)),
    ]);
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    let mut seed = 1u8;
    for &(sn, s) in &kinds {
        for &(dn, d) in &kinds {
            seed = seed.wrapping_add(37);
            let want: Vec<u8> = (0..half)
                .map(|i| (i as u8).wrapping_mul(seed) ^ seed)
                .collect();
            dev_put(&ctx, s, &want);
            let dst = d + half;
            dev_set(&ctx, dst, 0, half);
            l.append_memory_copy(dst, s, half, None, &[]).unwrap();
            assert_eq!(l.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
            assert!(
                dev_bytes(&ctx, dst, half) == want,
                "copy {sn} -> {dn} lost bytes"
            );
        }
    }
    drop(l);
    ctx.free_memory(heap.addr()).unwrap();
}

#[test]
fn fills_with_every_pattern_size_from_1_to_128_repeat_the_pattern() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let n = 64 * KIB;
    let buf = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    let mut len = 1;
    while len <= MAX_FILL_PATTERN_SIZE {
        let pattern: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) + 1).collect();
        dev_set(&ctx, buf, 0xAA, n);
        // An offset and a size that is not a multiple of the pattern: the tail gets a prefix.
        let off = 3;
        let size = 10 * KIB + 5;
        l.append_memory_fill(buf + off, &pattern, size, None, &[])
            .unwrap();
        l.host_synchronize(FOREVER).unwrap();
        let b = dev_bytes(&ctx, buf, n);
        for i in 0..size {
            assert_eq!(b[off + i], pattern[i % len], "pattern {len}, byte {i}");
        }
        assert!(
            b[..off].iter().all(|&x| x == 0xAA),
            "pattern {len} wrote before"
        );
        assert!(
            b[off + size..].iter().all(|&x| x == 0xAA),
            "pattern {len} wrote past the end"
        );
        len *= 2;
    }
}

#[test]
fn fill_pattern_not_a_power_of_two_up_to_128_is_invalid_size() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let buf = ctx.alloc_device(&d0, &AllocDesc::new(64 * KIB)).unwrap();
    let l = ctx.create_command_list(&d0).unwrap();
    for len in [0usize, 3, 6, 100, 129, 256] {
        let p = vec![1u8; len];
        assert_eq!(
            code(l.append_memory_fill(buf, &p, 64, None, &[])),
            INVALID_SIZE,
            "{len}"
        );
    }
}

/// Case 1 of `shared/cases/level-zero.md`: plain system memory (the heap, the stack) as a
/// source or destination of queued copies and fills; not held against frees; an unmapped or
/// inaccessible range is `InvalidArgument`, a read-only one no destination.
#[test]
fn system_memory_is_an_operand_of_copies_and_fills() {
    if common::skip() {
        return;
    }
    const { assert!(hetmem::queue::SYSTEM_MEMORY_IN_QUEUES) };
    let (_rt, d0, ctx) = setup1(64 << 20);
    let n = 64 * KIB;
    let a = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let src: Vec<u8> = (0..n).map(|i| (i * 13 + 5) as u8).collect();
    let mut dst = vec![0u8; n];
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    l.append_memory_copy(a, src.as_ptr() as usize, n, None, &[])
        .unwrap();
    l.append_memory_copy(dst.as_mut_ptr() as usize, a, n, None, &[])
        .unwrap();
    l.host_synchronize(u64::MAX).unwrap();
    assert_eq!(dst, src);
    let mut stack = [0u8; 100];
    l.append_memory_fill(stack.as_mut_ptr() as usize, &[1, 2, 3, 4], 99, None, &[])
        .unwrap();
    l.host_synchronize(u64::MAX).unwrap();
    assert_eq!(&std::hint::black_box(&stack)[..6], &[1, 2, 3, 4, 1, 2]);
    assert_eq!(stack[98], 3);
    assert_eq!(stack[99], 0);
    // Not held: the program frees it whenever it likes, with nothing waiting.
    drop(src);
    // Unmapped, inaccessible, read-only.
    let page = 4096;
    // SAFETY: a fresh private mapping of our own, then its second page unmapped.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * page,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(m, libc::MAP_FAILED);
    let m = m as usize;
    // SAFETY: our own mapping.
    assert_eq!(unsafe { libc::munmap((m + page) as *mut _, page) }, 0);
    for (what, r) in [
        (
            "unmapped source",
            l.append_memory_copy(a, m + page, 64, None, &[]),
        ),
        (
            "unmapped destination",
            l.append_memory_copy(m + page, a, 64, None, &[]),
        ),
        (
            "into the hole",
            l.append_memory_copy(a, m + page - 32, 64, None, &[]),
        ),
        (
            "read-only destination",
            l.append_memory_copy(m, a, 64, None, &[]),
        ),
        (
            "read-only fill",
            l.append_memory_fill(m, &[7], 64, None, &[]),
        ),
    ] {
        let err = r.expect_err(what);
        assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{what}: {err}");
    }
    l.append_memory_copy(a, m, 64, None, &[]).unwrap();
    // SAFETY: our own mapping; the copy from it has been appended to an immediate list,
    // synchronized first.
    l.host_synchronize(u64::MAX).unwrap();
    // ACL's streams follow ACL's rule: only memory the runtime knows.
    let acl = ctx
        .create_immediate_command_list_for(&d0, hetmem::queue::OperandRule::Acl)
        .unwrap();
    let heap = Box::new([0u8; 64]);
    for (what, r) in [
        (
            "ACL: a malloc source",
            acl.append_memory_copy(a, heap.as_ptr() as usize, 64, None, &[]),
        ),
        (
            "ACL: a malloc fill",
            acl.append_memory_fill(heap.as_ptr() as usize, &[1], 64, None, &[]),
        ),
    ] {
        let err = r.expect_err(what);
        assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{what}: {err}");
        assert!(
            err.to_string().contains("memory the runtime knows"),
            "{err}"
        );
    }
    acl.append_memory_copy(a, a + 64, 64, None, &[]).unwrap();
    acl.host_synchronize(u64::MAX).unwrap();
    // A range running from system memory into an allocation is refused, naming it.
    let h = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let err = l
        .append_memory_copy(a, h - 16, 64, None, &[])
        .expect_err("into an allocation");
    assert_eq!(err.ze_result(), INVALID_ARGUMENT, "{err}");
    ctx.free_memory(h).unwrap();
    assert_eq!(unsafe { libc::munmap(m as *mut _, page) }, 0);
    l.host_synchronize(u64::MAX).unwrap();
    ctx.free_memory(a).unwrap();
}

#[test]
fn bad_pointers_and_sizes_are_rejected_at_append_and_nothing_is_appended() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let n = 64 * KIB;
    let a = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let b = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    // A freed allocation, its range kept mapped PROT_NONE so that no mapping of another test
    // thread lands there (plain system memory that is mapped is an operand: case 1).
    let guard = |p: usize| {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping.
        let m = unsafe {
            libc::mmap(
                p as *mut _,
                n,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        m as usize == p
    };
    // Where the driver keeps a freed range reserved without access (the cuda backend: device
    // memory's VA stays in the driver's PROT_NONE reservation, host memory may stay in its
    // pinned cache), no other mapping lands there either; a range it keeps readable is system
    // memory (case 1) and is not a "freed" operand.
    let held_inaccessible =
        |p: usize| hetmem_linux::host_protection(p, n) == Some(hetmem_linux::Protection::None);
    let (freed, guarded) = (0..20)
        .find_map(|i| {
            let p = if i % 2 == 0 {
                ctx.alloc_host(&AllocDesc::new(n)).unwrap()
            } else {
                ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap()
            };
            ctx.free_memory(p).unwrap();
            if guard(p) {
                Some((p, true))
            } else {
                held_inaccessible(p).then_some((p, false))
            }
        })
        .expect("a freed range stays unmapped (or without access) long enough to guard it");
    // Memory of no kind: a page that is never mapped (Linux keeps the first 64 KiB unmapped);
    // plain system memory is an operand (system_memory_is_an_operand_of_copies_and_fills).
    let unknown = 4096usize;
    dev_set(&ctx, a, 0x11, n);
    let l = ctx.create_command_list(&d0).unwrap();
    let cases: Vec<(&str, hetmem::Result<()>, u32)> = vec![
        (
            "null dst",
            l.append_memory_copy(0, b, 16, None, &[]),
            INVALID_NULL_POINTER,
        ),
        (
            "null src",
            l.append_memory_copy(a, 0, 16, None, &[]),
            INVALID_NULL_POINTER,
        ),
        (
            "null fill",
            l.append_memory_fill(0, &[1], 16, None, &[]),
            INVALID_NULL_POINTER,
        ),
        (
            "unknown dst",
            l.append_memory_copy(unknown, b, 16, None, &[]),
            INVALID_ARGUMENT,
        ),
        (
            "unknown src",
            l.append_memory_copy(a, unknown, 16, None, &[]),
            INVALID_ARGUMENT,
        ),
        (
            "freed dst",
            l.append_memory_copy(freed, b, 16, None, &[]),
            INVALID_ARGUMENT,
        ),
        (
            "copy past end of allocation",
            l.append_memory_copy(a + 1, b, n, None, &[]),
            INVALID_ARGUMENT,
        ),
        (
            "fill past end of allocation",
            l.append_memory_fill(a, &[1], n + 1, None, &[]),
            INVALID_ARGUMENT,
        ),
        (
            "size overflows the address space",
            l.append_memory_copy(a, b, usize::MAX, None, &[]),
            INVALID_ARGUMENT,
        ),
    ];
    for (what, r, want) in cases {
        assert_eq!(code(r), want, "{what}");
    }
    // Nothing of the rejected appends was recorded: executing the list changes nothing.
    l.close().unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    q.execute_command_lists(&[&l], None).unwrap();
    q.synchronize(FOREVER).unwrap();
    assert!(dev_all(&ctx, a, n, 0x11));
    // An interior, in-bounds copy is fine.
    let ok = ctx.create_command_list(&d0).unwrap();
    ok.append_memory_copy(a + 100, b + 200, n - 200, None, &[])
        .unwrap();
    if guarded {
        // SAFETY: the guard mapped above (a range the driver holds is left to it).
        unsafe { libc::munmap(freed as *mut _, n) };
    }
}

#[repr(C, align(4096))]
struct Pages([u8; 2 * 4096]);
static READ_ONLY: Pages = Pages([7; 2 * 4096]);

#[test]
fn read_only_import_can_be_a_source_but_not_a_destination() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let ro = std::ptr::addr_of!(READ_ONLY) as usize;
    ctx.import_system_memory(ro, 2 * 4096, true).unwrap();
    let a = ctx.alloc_device(&d0, &AllocDesc::new(8192)).unwrap();
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    assert_eq!(
        code(l.append_memory_copy(ro, a, 8192, None, &[])),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(l.append_memory_fill(ro, &[1], 16, None, &[])),
        INVALID_ARGUMENT
    );
    l.append_memory_copy(a, ro, 8192, None, &[]).unwrap();
    l.host_synchronize(FOREVER).unwrap();
    assert!(dev_all(&ctx, a, 8192, 7));
    assert!(READ_ONLY.0.iter().all(|&x| x == 7));
    ctx.free_memory(ro).unwrap();
}

#[test]
fn virtual_memory_operands_need_mapped_pages_with_the_right_access() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let page = ctx.query_page_size(&d0, 2 * MIB).unwrap();
    let r = ctx.reserve(None, 2 * page).unwrap();
    let phys = ctx
        .create_physical_memory(Some(&d0), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    ctx.map(r.base, page, phys, 0, AccessAttribute::ReadWrite)
        .unwrap();
    let h = ctx.alloc_host(&AllocDesc::new(64 * KIB)).unwrap();
    let l = ctx.create_command_list(&d0).unwrap();
    // Running into the unmapped second page.
    assert_eq!(
        code(l.append_memory_copy(r.base + page - 16, h, 32, None, &[])),
        INVALID_ARGUMENT
    );
    // Wholly in the unmapped page.
    assert_eq!(
        code(l.append_memory_fill(r.base + page, &[1], 16, None, &[])),
        INVALID_ARGUMENT
    );
    // Past the end of the reservation.
    assert_eq!(
        code(l.append_memory_copy(h, r.base + 2 * page - 8, 16, None, &[])),
        INVALID_ARGUMENT
    );
    ctx.set_access_attribute(r.base, page, AccessAttribute::ReadOnly)
        .unwrap();
    assert_eq!(
        code(l.append_memory_copy(r.base, h, 16, None, &[])),
        INVALID_ARGUMENT,
        "read-only pages are no destination"
    );
    // What hetmem reports for it (zeDeviceGetProperties' readonlyCapability, case 2 of
    // shared/cases/level-zero.md): the refusal above is the rule it names.
    const { assert!(hetmem::vmm::DEVICE_WRITES_TO_READONLY_REFUSED) };
    l.append_memory_copy(h, r.base, 16, None, &[]).unwrap();
    ctx.set_access_attribute(r.base, page, AccessAttribute::None)
        .unwrap();
    assert_eq!(
        code(l.append_memory_copy(h, r.base, 16, None, &[])),
        INVALID_ARGUMENT,
        "NONE pages are no source"
    );
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(phys).unwrap();
}

#[test]
fn memory_freed_between_append_and_execute_is_rejected_at_execute() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let a = ctx.alloc_device(&d0, &AllocDesc::new(64 * KIB)).unwrap();
    let b = ctx.alloc_host(&AllocDesc::new(64 * KIB)).unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(a, b, 64 * KIB, None, &[]).unwrap()
    });
    ctx.free_memory(b).unwrap();
    // Keep the freed range from being mapped again by another test thread (mapped system
    // memory is an operand, case 1): a PROT_NONE guard, or the check is moot.
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping.
    let g = unsafe {
        libc::mmap(
            b as *mut _,
            64 * KIB,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    let q = ctx.create_command_queue(&d0).unwrap();
    if g as usize == b {
        assert_eq!(code(q.execute_command_lists(&[&l], None)), INVALID_ARGUMENT);
        // SAFETY: our guard.
        unsafe { libc::munmap(b as *mut _, 64 * KIB) };
    }
    assert_eq!(q.synchronize(0).unwrap(), SyncStatus::Ready);
}

#[test]
fn list_state_rules_closed_open_immediate_and_empty() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(64 << 20);
    let a = ctx.alloc_device(&d0, &AllocDesc::new(64 * KIB)).unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    let open = ctx.create_command_list(&d0).unwrap();
    open.append_memory_fill(a, &[1], 16, None, &[]).unwrap();
    assert_eq!(
        code(q.execute_command_lists(&[&open], None)),
        INVALID_ARGUMENT
    );
    assert_eq!(code(q.execute_command_lists(&[], None)), INVALID_SIZE);
    open.close().unwrap();
    assert_eq!(
        code(open.append_memory_fill(a, &[1], 16, None, &[])),
        INVALID_ARGUMENT,
        "append to a closed list"
    );
    open.reset().unwrap();
    open.append_memory_fill(a, &[2], 16, None, &[]).unwrap();
    let imm = ctx.create_immediate_command_list(&d0).unwrap();
    assert!(imm.is_immediate());
    assert_eq!(
        code(q.execute_command_lists(&[&imm], None)),
        INVALID_ARGUMENT
    );
    if rt.driver().device_list().len() >= 2 {
        let other = closed_list(&ctx, &rt.driver().device(1).unwrap(), |_| {});
        assert_eq!(
            code(q.execute_command_lists(&[&other], None)),
            INVALID_ARGUMENT,
            "list of another device"
        );
    } else {
        common::part_not_applicable_on(
            hetmem::BackendKind::Cuda,
            "a list of another device's queue: this machine has one GPU",
        );
    }
    let q2 = ctx.create_command_queue(&d0).unwrap();
    let f2 = q2.create_fence(false).unwrap();
    open.close().unwrap();
    assert_eq!(
        code(q.execute_command_lists(&[&open], Some(&f2))),
        INVALID_ARGUMENT,
        "fence of another queue"
    );
    let fresh = ctx.create_command_list(&d0).unwrap();
    assert_eq!(
        code(fresh.append_wait_on_events(&[])),
        INVALID_SIZE,
        "waiting on no event"
    );
}

#[test]
fn overlapping_copies_behave_as_memmove() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let n = 4096;
    let a = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let init: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    // Forward overlap.
    dev_put(&ctx, a, &init);
    l.append_memory_copy(a + 100, a, 1000, None, &[]).unwrap();
    l.host_synchronize(FOREVER).unwrap();
    let mut want = init.clone();
    want.copy_within(0..1000, 100);
    assert!(dev_bytes(&ctx, a, n) == want);
    // Backward overlap.
    dev_put(&ctx, a, &init);
    l.append_memory_copy(a, a + 100, 1000, None, &[]).unwrap();
    l.host_synchronize(FOREVER).unwrap();
    let mut want = init.clone();
    want.copy_within(100..1100, 0);
    assert!(dev_bytes(&ctx, a, n) == want);
}

#[test]
fn events_signalled_on_one_queue_release_waits_on_another() {
    if common::skip() {
        return;
    }
    let (_rt, d0, d1, ctx) = setup(64 << 20);
    let n = 64 * KIB;
    let x = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let y = ctx.alloc_device(&d1, &AllocDesc::new(n)).unwrap();
    let filled = ctx.create_event().unwrap();
    let copied = ctx.create_event().unwrap();
    let qa = ctx.create_command_queue(&d1).unwrap();
    let qb = ctx.create_command_queue(&d0).unwrap();
    // Queue A waits for B's fill, then copies and signals.
    let la = closed_list(&ctx, &d1, |l| {
        l.append_memory_copy(y, x, n, Some(&copied), &[&filled])
            .unwrap()
    });
    qa.execute_command_lists(&[&la], None).unwrap();
    assert_eq!(
        copied.host_synchronize(20_000_000).unwrap(),
        SyncStatus::NotReady,
        "the copy must wait for the fill's event"
    );
    assert_eq!(qa.synchronize(0).unwrap(), SyncStatus::NotReady);
    let lb = closed_list(&ctx, &d0, |l| {
        l.append_memory_fill(x, &[0x5A, 0xA5], n, None, &[])
            .unwrap();
        l.append_signal_event(&filled).unwrap();
    });
    qb.execute_command_lists(&[&lb], None).unwrap();
    assert_eq!(copied.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert_eq!(copied.query_status().unwrap(), SyncStatus::Ready);
    let yb = dev_bytes(&ctx, y, n);
    assert!(yb.chunks(2).all(|c| c == [0x5A, 0xA5]));
    // Host reset, host signal, barrier and wait-on-events.
    copied.host_reset().unwrap();
    assert_eq!(copied.query_status().unwrap(), SyncStatus::NotReady);
    let gate = ctx.create_event().unwrap();
    let done = ctx.create_event().unwrap();
    let lc = closed_list(&ctx, &d1, |l| {
        l.append_wait_on_events(&[&gate]).unwrap();
        l.append_memory_fill(y, &[9], n, None, &[]).unwrap();
        l.append_barrier(Some(&done), &[]).unwrap();
    });
    qa.execute_command_lists(&[&lc], None).unwrap();
    assert_eq!(done.host_synchronize(0).unwrap(), SyncStatus::NotReady);
    gate.host_signal().unwrap();
    assert_eq!(done.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(dev_all(&ctx, y, n, 9));
}

#[test]
fn fence_is_signalled_when_its_batch_finishes_and_resets() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let a = ctx.alloc_device(&d0, &AllocDesc::new(64 * KIB)).unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    let f = q.create_fence(false).unwrap();
    let gate = ctx.create_event().unwrap();
    assert_eq!(f.query_status().unwrap(), SyncStatus::NotReady);
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_fill(a, &[3], 64 * KIB, None, &[&gate])
            .unwrap()
    });
    q.execute_command_lists(&[&l], Some(&f)).unwrap();
    assert_eq!(f.host_synchronize(5_000_000).unwrap(), SyncStatus::NotReady);
    gate.host_signal().unwrap();
    assert_eq!(f.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(dev_all(&ctx, a, 64 * KIB, 3));
    f.reset().unwrap();
    assert_eq!(f.query_status().unwrap(), SyncStatus::NotReady);
}

#[test]
fn synchronize_with_a_timeout_returns_not_ready_until_the_work_finishes() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(256 << 20);
    let n = 16 * MIB;
    let src = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let dst = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    unsafe { bytes(src, n) }
        .chunks_mut(4)
        .for_each(|c| c.copy_from_slice(&[1, 2, 3, 4]));
    zero_on_cuda(&ctx, dst, n, false);
    let q = ctx.create_command_queue(&d0).unwrap();
    // The copy is held behind an event nobody has signalled yet, so the queue is busy for as
    // long as the test wants, whatever the machine's speed.
    let gate = ctx.create_event().unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(dst, src, n, None, &[&gate]).unwrap()
    });
    q.execute_command_lists(&[&l], None).unwrap();
    assert_eq!(q.synchronize(0).unwrap(), SyncStatus::NotReady);
    let t = Instant::now();
    assert_eq!(q.synchronize(1_000_000).unwrap(), SyncStatus::NotReady);
    assert!(
        t.elapsed() >= Duration::from_micros(900),
        "waited its timeout"
    );
    assert_eq!(SyncStatus::NotReady.ze_result(), 1);
    assert!(dev_all(&ctx, dst, n, 0), "copy ran early");
    gate.host_signal().unwrap();
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert_eq!(q.synchronize(0).unwrap(), SyncStatus::Ready);
    assert_eq!(SyncStatus::Ready.ze_result(), 0);
    let d = dev_bytes(&ctx, dst, n);
    for off in [0, 4, n / 2, n - 4] {
        assert_eq!(&d[off..off + 4], &[1, 2, 3, 4], "offset {off}");
    }
}

/// How long a negative check ("not signalled yet") waits, and how long a positive one may take
/// before the test fails instead of hanging.
const NOT_YET_NS: u64 = 30_000_000;
const AT_MOST_NS: u64 = 30_000_000_000;

#[test]
fn barrier_waits_for_its_events_before_later_commands_run() {
    if common::skip() {
        return;
    }
    let (_rt, d0, d1, ctx) = setup(64 << 20);
    let n = 64 * KIB;
    let y = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    zero_on_cuda(&ctx, y, n, false);
    // Queue B signals `ev_b` once the host opens `gate_b`.
    let qb = ctx.create_command_queue(&d1).unwrap();
    let gate_b = ctx.create_event().unwrap();
    let ev_b = ctx.create_event().unwrap();
    let lb = closed_list(&ctx, &d1, |l| {
        l.append_barrier(Some(&ev_b), &[&gate_b]).unwrap()
    });
    qb.execute_command_lists(&[&lb], None).unwrap();
    // Queue A: a barrier waiting on queue B's event, then a fill that must not run before it.
    let qa = ctx.create_command_queue(&d0).unwrap();
    let filled = ctx.create_event().unwrap();
    let la = closed_list(&ctx, &d0, |l| {
        l.append_barrier(None, &[&ev_b]).unwrap();
        l.append_memory_fill(y, &[7], n, Some(&filled), &[])
            .unwrap();
    });
    qa.execute_command_lists(&[&la], None).unwrap();
    assert_eq!(
        filled.host_synchronize(NOT_YET_NS).unwrap(),
        SyncStatus::NotReady,
        "the fill after the barrier ran before the barrier's event was signalled"
    );
    assert!(dev_all(&ctx, y, n, 0));
    assert_eq!(qa.synchronize(0).unwrap(), SyncStatus::NotReady);
    assert_eq!(ev_b.query_status().unwrap(), SyncStatus::NotReady);
    gate_b.host_signal().unwrap();
    assert_eq!(
        ev_b.host_synchronize(AT_MOST_NS).unwrap(),
        SyncStatus::Ready
    );
    assert_eq!(
        filled.host_synchronize(AT_MOST_NS).unwrap(),
        SyncStatus::Ready
    );
    assert!(dev_all(&ctx, y, n, 7));
    assert_eq!(qa.synchronize(AT_MOST_NS).unwrap(), SyncStatus::Ready);
    assert_eq!(qb.synchronize(AT_MOST_NS).unwrap(), SyncStatus::Ready);
}

#[test]
fn barrier_signals_its_event_only_after_every_prior_command() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let n = 256 * KIB;
    let src = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let mid = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let dst = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    unsafe { bytes(src, n) }.fill(0x3C);
    zero_on_cuda(&ctx, dst, n, true);
    let q = ctx.create_command_queue(&d0).unwrap();
    let gate = ctx.create_event().unwrap();
    let bar = ctx.create_event().unwrap();
    // Prior commands: a copy held behind `gate`, then a second copy; then the barrier.
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(mid, src, n, None, &[&gate]).unwrap();
        l.append_memory_copy(dst, mid, n, None, &[]).unwrap();
        l.append_barrier(Some(&bar), &[]).unwrap();
    });
    q.execute_command_lists(&[&l], None).unwrap();
    assert_eq!(
        bar.host_synchronize(NOT_YET_NS).unwrap(),
        SyncStatus::NotReady,
        "the barrier signalled while earlier commands were still waiting"
    );
    assert!(unsafe { bytes(dst, n) }.iter().all(|&b| b == 0));
    gate.host_signal().unwrap();
    assert_eq!(bar.host_synchronize(AT_MOST_NS).unwrap(), SyncStatus::Ready);
    // When the barrier's event is seen signalled, both earlier copies have finished.
    assert!(
        unsafe { bytes(dst, n) }.iter().all(|&b| b == 0x3C),
        "the barrier signalled before the copies before it finished"
    );
    assert_eq!(q.synchronize(AT_MOST_NS).unwrap(), SyncStatus::Ready);
}

/// Runs in a child process (this test binary, this test only, one test thread), so no other
/// test's threads disturb the count.
#[test]
fn dropping_queues_and_immediate_lists_joins_their_engine_threads() {
    if common::skip() {
        return;
    }
    const CHILD: &str = "HETMEM_QUEUE_THREAD_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let out = common::run_test_in_child(
            "dropping_queues_and_immediate_lists_joins_their_engine_threads",
            &[(CHILD, "1")],
        );
        assert!(
            out.status.success(),
            "child failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        return;
    }
    // On cuda the driver starts threads of its own, once per process (at cuInit and the first
    // context, stream and copy), which stay: a runtime that has run a copy on a queue of its
    // own is kept through the count, so that only the engines' threads are counted. A cuda
    // engine has two threads (the one that queues onto its stream and the one that waits for
    // its completions); a host engine has one.
    let _warm = on_cuda().then(|| {
        let (rt, d0, ctx) = setup1(64 << 20);
        let a = ctx.alloc_device(&d0, &AllocDesc::new(MIB)).unwrap();
        let q = ctx.create_command_queue(&d0).unwrap();
        let l = closed_list(&ctx, &d0, |l| {
            l.append_memory_fill(a, &[1], MIB, None, &[]).unwrap()
        });
        q.execute_command_lists(&[&l], None).unwrap();
        q.synchronize(FOREVER).unwrap();
        drop(q);
        ctx.free_memory(a).unwrap();
        (rt, ctx)
    });
    let per_engine = if on_cuda() { 2 } else { 1 };
    let before = task_count();
    {
        let (_rt, d0, d1, ctx) = setup(64 << 20);
        let a = ctx.alloc_device(&d0, &AllocDesc::new(MIB)).unwrap();
        let queues: Vec<_> = (0..3)
            .map(|i| ctx.create_command_queue(if i % 2 == 0 { &d0 } else { &d1 }))
            .collect::<Result<_, _>>()
            .unwrap();
        let imm = ctx.create_immediate_command_list(&d1).unwrap();
        assert_eq!(
            task_count(),
            before + 4 * per_engine,
            "{per_engine} engine thread(s) per queue / list"
        );
        let never = ctx.create_event().unwrap();
        for q in &queues {
            let dev = q.device().clone();
            let l = closed_list(&ctx, &dev, |l| {
                l.append_memory_fill(a, &[1], MIB, None, &[]).unwrap()
            });
            q.execute_command_lists(&[&l], None).unwrap();
        }
        // Work waiting on an event nobody signals must not keep the thread alive.
        imm.append_memory_fill(a, &[2], MIB, None, &[&never])
            .unwrap();
        drop(queues);
        drop(imm);
        drop(ctx);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while task_count() != before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(task_count(), before, "engine threads leaked");
}

// ---- Free policies (zeMemFreeExt) against real in-flight work ----

#[test]
fn free_policy_over_0x3_is_invalid_enumeration_and_the_driver_reports_both_policies() {
    if common::skip() {
        return;
    }
    let (rt, _d0, _ctx) = setup1(64 << 20);
    assert_eq!(FreePolicy::from_raw(0).unwrap(), FreePolicy::Immediate);
    assert_eq!(FreePolicy::from_raw(1).unwrap(), FreePolicy::Blocking);
    assert_eq!(FreePolicy::from_raw(2).unwrap(), FreePolicy::Defer);
    assert_eq!(FreePolicy::from_raw(3).unwrap(), FreePolicy::Blocking);
    for bad in [4u32, 5, 0xff, u32::MAX] {
        assert_eq!(
            code(FreePolicy::from_raw(bad)),
            INVALID_ENUMERATION,
            "{bad:#x}"
        );
    }
    assert_eq!(rt.driver().memory_free_policies(), 0x3);
}

#[test]
fn blocking_free_returns_only_after_the_512mib_copy_event_is_signalled() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(2 << 30);
    let n = 512 * MIB;
    let src = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let dst = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let used = d0.used_memory();
    let q = ctx.create_command_queue(&d0).unwrap();
    let gate = ctx.create_event().unwrap();
    let done = ctx.create_event().unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(dst, src, n, Some(&done), &[&gate])
            .unwrap()
    });
    q.execute_command_lists(&[&l], None).unwrap();
    let g = gate.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        g.host_signal().unwrap();
    });
    let t = Instant::now();
    ctx.free_memory_ext(dst, FreePolicy::Blocking).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(90),
        "returned before the work"
    );
    assert_eq!(done.query_status().unwrap(), SyncStatus::Ready);
    assert_eq!(
        d0.used_memory(),
        used - n as u64,
        "capacity back after the free"
    );
    assert_eq!(rt.driver().pending_frees(), 0);
    opener.join().unwrap();
    ctx.free_memory_ext(src, FreePolicy::Blocking).unwrap();
}

#[test]
fn defer_free_returns_at_once_and_capacity_comes_back_after_the_work() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(1 << 30);
    let n = 64 * MIB;
    let src = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let before = d0.used_memory();
    let dst = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    let gate = ctx.create_event().unwrap();
    let done = ctx.create_event().unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(dst, src, n, Some(&done), &[&gate])
            .unwrap()
    });
    q.execute_command_lists(&[&l], None).unwrap();
    ctx.free_memory_ext(dst, FreePolicy::Defer).unwrap();
    assert_eq!(done.query_status().unwrap(), SyncStatus::NotReady);
    // The pointer is invalid at once; the capacity is still held.
    assert_eq!(code(ctx.free_memory(dst)), INVALID_ARGUMENT);
    assert_eq!(
        ctx.get_allocation_properties(dst).unwrap().memory_type,
        hetmem::MemoryType::Unknown
    );
    let l2 = ctx.create_command_list(&d0).unwrap();
    assert_eq!(
        code(l2.append_memory_fill(dst, &[1], 16, None, &[])),
        INVALID_ARGUMENT
    );
    assert_eq!(d0.used_memory(), before + n as u64);
    assert_eq!(rt.driver().pending_frees(), 1);
    gate.host_signal().unwrap();
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert_eq!(done.query_status().unwrap(), SyncStatus::Ready);
    assert_eq!(d0.used_memory(), before, "capacity back after the work");
    assert_eq!(rt.driver().pending_frees(), 0);
}

#[test]
fn free_now_with_work_in_flight_never_lets_the_engine_touch_a_later_allocation() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(256 << 20);
    let n = 16 * MIB;
    let src = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    unsafe { bytes(src, n) }.fill(0x11);
    let before = d0.used_memory();
    let a = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    let gate = ctx.create_event().unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        l.append_memory_copy(a, src, n, None, &[&gate]).unwrap();
        l.append_memory_fill(a, &[0x22], n, None, &[]).unwrap();
    });
    q.execute_command_lists(&[&l], None).unwrap();
    ctx.free_memory(a).unwrap();
    assert_eq!(
        d0.used_memory(),
        before,
        "free now gives the capacity back at once"
    );
    // Later allocations never get the memory the queued work will write.
    let later: Vec<usize> = (0..4)
        .map(|_| ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap())
        .collect();
    for &b in &later {
        assert!(
            b + n <= a || b >= a + n,
            "a later allocation overlaps freed in-flight memory"
        );
        dev_set(&ctx, b, 0x77, n);
    }
    gate.host_signal().unwrap();
    q.synchronize(FOREVER).unwrap();
    for &b in &later {
        assert!(dev_all(&ctx, b, n, 0x77));
    }
    assert_eq!(
        rt.driver().pending_frees(),
        0,
        "the memory went after the work"
    );
    assert_eq!(rt.driver().usm_stats().allocations, 5);
}

#[test]
fn blocking_free_without_work_in_flight_frees_at_once() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(64 << 20);
    let before = d0.used_memory();
    let a = ctx.alloc_device(&d0, &AllocDesc::new(MIB)).unwrap();
    ctx.free_memory_ext(a, FreePolicy::Blocking).unwrap();
    assert_eq!(d0.used_memory(), before);
    assert_eq!(rt.driver().usm_stats().allocations, 0);
    assert_eq!(
        code(ctx.free_memory_ext(a, FreePolicy::Defer)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(ctx.free_memory_ext(0, FreePolicy::Immediate)),
        INVALID_NULL_POINTER
    );
}

#[test]
fn free_descriptor_with_the_properties_stype_is_accepted_and_others_are_invalid_argument() {
    if common::skip() {
        return;
    }
    // ZE_STRUCTURE_TYPE_MEMORY_FREE_EXT_DESC and, as the conformance suite sends it,
    // ZE_STRUCTURE_TYPE_DRIVER_MEMORY_FREE_EXT_PROPERTIES.
    for stype in [0x1000a, 0x10009] {
        assert_eq!(
            FreePolicy::from_desc(stype, 0).unwrap(),
            FreePolicy::Immediate
        );
        assert_eq!(
            FreePolicy::from_desc(stype, 1).unwrap(),
            FreePolicy::Blocking
        );
        assert_eq!(FreePolicy::from_desc(stype, 2).unwrap(), FreePolicy::Defer);
        assert_eq!(
            FreePolicy::from_desc(stype, 3).unwrap(),
            FreePolicy::Blocking
        );
    }
    assert_eq!(FreePolicy::DESC_STYPE, 0x1000a);
    assert_eq!(FreePolicy::PROPERTIES_STYPE, 0x10009);
    for bad in [0u32, 0x10008, 0x1000b, 0x00020049, u32::MAX] {
        let e = FreePolicy::from_desc(bad, 1).unwrap_err();
        assert_eq!(e.ze_result(), INVALID_ARGUMENT, "stype {bad:#x}");
        assert!(e.message().contains(&format!("{bad:#x}")), "{e}");
    }
    // A policy over 0x3 is INVALID_ENUMERATION whatever the stype (checked first).
    for stype in [0x1000a, 0x10009, 0] {
        let e = FreePolicy::from_desc(stype, 4).unwrap_err();
        assert_eq!(e.ze_result(), INVALID_ENUMERATION, "stype {stype:#x}");
        assert!(e.message().contains("0x4"), "{e}");
    }
}

#[test]
fn context_teardown_defers_release_of_memory_that_queued_work_references() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(1 << 30);
    let n = 128 * MIB;
    let before = d0.used_memory();
    // The memory belongs to `other`; the queue and the work to `ctx`.
    let other = rt.driver().create_context().unwrap();
    let src = other.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    let scratch = other.alloc_host(&AllocDesc::new(n)).unwrap();
    dev_set(&other, src, 0x5a, n);
    let dst = ctx.alloc_host(&AllocDesc::new(n)).unwrap();
    let q = ctx.create_command_queue(&d0).unwrap();
    let gate = ctx.create_event().unwrap();
    let l = closed_list(&ctx, &d0, |l| {
        // Reads `src` and writes `scratch` of the context about to go, after the gate.
        l.append_memory_copy(dst, src, n, None, &[&gate]).unwrap();
        l.append_memory_fill(scratch, &[7], n, None, &[]).unwrap();
    });
    q.execute_command_lists(&[&l], None).unwrap();
    drop(other); // the last handle: zeContextDestroy with work in flight
                 // Its allocations are gone from the bookkeeping at once, their memory is not.
    assert_eq!(
        rt.driver().usm_stats().allocations,
        1,
        "only ctx's dst left"
    );
    assert_eq!(
        ctx.get_allocation_properties(src).unwrap().memory_type,
        hetmem::MemoryType::Unknown
    );
    assert_eq!(rt.driver().pending_frees(), 2);
    assert_eq!(
        d0.used_memory(),
        before + n as u64,
        "capacity held while work references it"
    );
    // Later allocations never get the memory the queued work still uses.
    let later = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
    assert!(later + n <= src || later >= src + n);
    assert!(later + n <= scratch || later >= scratch + n);
    gate.host_signal().unwrap();
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(
        unsafe { bytes(dst, n) }.iter().all(|&b| b == 0x5a),
        "the copy read the torn-down context's memory intact"
    );
    assert_eq!(rt.driver().pending_frees(), 0, "released after the work");
    ctx.free_memory(later).unwrap();
    assert_eq!(d0.used_memory(), before, "capacity back after the work");
    ctx.free_memory(dst).unwrap();
    assert_eq!(rt.driver().usm_stats(), hetmem::UsmStats::default());
}

#[test]
fn context_teardown_without_work_in_flight_releases_at_once() {
    if common::skip() {
        return;
    }
    let (rt, d0, _ctx) = setup1(256 << 20);
    let before = d0.used_memory();
    let other = rt.driver().create_context().unwrap();
    other.alloc_device(&d0, &AllocDesc::new(4 * MIB)).unwrap();
    other.alloc_shared(Some(&d0), &AllocDesc::new(MIB)).unwrap();
    other.alloc_host(&AllocDesc::new(MIB)).unwrap();
    // Charged in whole pages of the device (64 KiB on the host backend, 2 MiB on cuda).
    let shared = MIB.next_multiple_of(common::page_for(&other, MIB));
    assert_eq!(d0.used_memory(), before + (4 * MIB + shared) as u64);
    drop(other);
    assert_eq!(rt.driver().pending_frees(), 0);
    assert_eq!(d0.used_memory(), before);
    assert_eq!(rt.driver().usm_stats(), hetmem::UsmStats::default());
}

#[test]
fn shared_allocations_are_reachable_from_the_host_and_every_device() {
    if common::skip() {
        return;
    }
    let (rt, d0, ctx) = setup1(64 << 20);
    let Some(d1) = second_device(&rt) else {
        return;
    };
    let n = 64 * KIB;
    let q = n / 4;
    let q0 = ctx.create_command_queue(&d0).unwrap();
    let q1 = ctx.create_command_queue(&d1).unwrap();
    for assoc in [Some(&d0), Some(&d1), None] {
        let s = ctx.alloc_shared(assoc, &AllocDesc::new(n)).unwrap();
        let p = ctx.get_allocation_properties(s).unwrap();
        assert_eq!(p.memory_type, hetmem::MemoryType::Shared);
        assert_eq!(p.device, assoc.map(|d| d.ordinal()));
        let out0 = ctx.alloc_device(&d0, &AllocDesc::new(n)).unwrap();
        let out1 = ctx.alloc_device(&d1, &AllocDesc::new(n)).unwrap();
        zero_on_cuda(&ctx, s, n, true);
        // The host writes the first quarter, device 0 the second, device 1 the third.
        unsafe { bytes(s, q) }.fill(1);
        let l0 = closed_list(&ctx, &d0, |l| {
            l.append_memory_fill(s + q, &[2], q, None, &[]).unwrap();
            l.append_memory_copy(out0, s, n, None, &[]).unwrap();
        });
        q0.execute_command_lists(&[&l0], None).unwrap();
        assert_eq!(q0.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
        let l1 = closed_list(&ctx, &d1, |l| {
            l.append_memory_fill(s + 2 * q, &[3], q, None, &[]).unwrap();
            l.append_memory_copy(out1, s, n, None, &[]).unwrap();
        });
        q1.execute_command_lists(&[&l1], None).unwrap();
        assert_eq!(q1.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
        let want = |upto: u8| -> Vec<u8> {
            (0..4u8)
                .flat_map(|i| std::iter::repeat_n(if i < upto { i + 1 } else { 0 }, q))
                .collect()
        };
        assert_eq!(unsafe { bytes(s, n) }, &want(3)[..], "host view");
        assert_eq!(dev_bytes(&ctx, out0, n), want(2), "device 0 read");
        assert_eq!(dev_bytes(&ctx, out1, n), want(3), "device 1 read");
        for a in [s, out0, out1] {
            ctx.free_memory(a).unwrap();
        }
    }
}

#[repr(C, align(4096))]
struct Pages4k([u8; 2 * 4096]);
static mut IMPORT_STATIC_RW: Pages4k = Pages4k([0; 2 * 4096]);
static IMPORT_STATIC_RO: Pages4k = Pages4k([0x3c; 2 * 4096]);

#[test]
fn imports_of_heap_stack_static_and_read_only_memory_carry_device_copies_in_and_out() {
    if common::skip() {
        return;
    }
    let (_rt, d0, d1, ctx) = setup(64 << 20);
    let n = 2 * 4096;
    let dev = ctx.alloc_device(&d1, &AllocDesc::new(n)).unwrap();
    let imm = ctx.create_immediate_command_list(&d0).unwrap();
    let q1 = ctx.create_command_queue(&d1).unwrap();
    let heap = HeapPages::new(n);
    let mut stack = Pages4k([0; 2 * 4096]);
    let regions = [
        ("heap", heap.addr()),
        ("stack", stack.0.as_mut_ptr() as usize),
        ("static", std::ptr::addr_of_mut!(IMPORT_STATIC_RW) as usize),
    ];
    for (k, (name, p)) in regions.into_iter().enumerate() {
        assert_eq!(ctx.import_system_memory(p, n, false).unwrap(), p, "{name}");
        // In: device memory -> the import, on device 0's immediate list.
        dev_set(&ctx, dev, 0x10 + k as u8, n);
        imm.append_memory_copy(p, dev, n, None, &[]).unwrap();
        assert_eq!(imm.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
        assert!(
            unsafe { bytes(p, n) }.iter().all(|&b| b == 0x10 + k as u8),
            "copy into {name} import"
        );
        // Out: the import -> device memory, on device 1's queue.
        unsafe { bytes(p, n) }.fill(0x20 + k as u8);
        let l = closed_list(&ctx, &d1, |l| {
            l.append_memory_copy(dev, p, n, None, &[]).unwrap()
        });
        q1.execute_command_lists(&[&l], None).unwrap();
        assert_eq!(q1.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
        assert!(
            dev_all(&ctx, dev, n, 0x20 + k as u8),
            "copy out of {name} import"
        );
        ctx.free_memory(p).unwrap();
    }
    std::hint::black_box(&mut stack);
    // Read-only static memory: only with the read-only flag, then devices only read it.
    let ro = std::ptr::addr_of!(IMPORT_STATIC_RO) as usize;
    assert_eq!(
        code(ctx.import_system_memory(ro, n, false)),
        INVALID_ARGUMENT
    );
    assert_eq!(ctx.import_system_memory(ro, n, true).unwrap(), ro);
    imm.append_memory_copy(dev, ro, n, None, &[]).unwrap();
    assert_eq!(imm.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(dev_all(&ctx, dev, n, 0x3c));
    assert_eq!(
        code(imm.append_memory_copy(ro, dev, n, None, &[])),
        INVALID_ARGUMENT,
        "a read-only import is not a destination"
    );
    assert_eq!(
        code(imm.append_memory_fill(ro, &[0], n, None, &[])),
        INVALID_ARGUMENT
    );
    ctx.free_memory(ro).unwrap();
    assert!(IMPORT_STATIC_RO.0.iter().all(|&b| b == 0x3c));
}

#[test]
fn driver_reports_the_free_policies_it_supports() {
    if common::skip() {
        return;
    }
    let (rt, _d0, _ctx) = setup1(64 << 20);
    // ze_driver_memory_free_ext_properties_t.freePolicies: BLOCKING_FREE | DEFER_FREE.
    assert_eq!(rt.driver().memory_free_policies(), 0x3);
    assert_eq!(FreePolicy::SUPPORTED, 0x3);
    for raw in 0..=FreePolicy::SUPPORTED {
        assert!(FreePolicy::from_raw(raw).is_ok(), "{raw:#x} is supported");
    }
    assert_eq!(FreePolicy::Blocking.raw(), 1);
    assert_eq!(FreePolicy::Defer.raw(), 2);
}

/// `zeEventDestroy`: "the application must ensure the device is not currently referencing the
/// event" — an event that queued work waits on is `HandleObjectInUse` (destroying it would
/// leave that work, and every unmap or free waiting for it, blocked forever); once the wait is
/// over it can go. A pending signal does not hold it, nor does a list that only records a wait.
#[test]
fn an_event_waited_on_by_queued_or_recorded_work_cannot_be_destroyed() {
    if common::skip() {
        return;
    }
    let (_rt, d0, ctx) = setup1(64 << 20);
    let buf = ctx.alloc_device(&d0, &AllocDesc::new(64 * KIB)).unwrap();
    let gate = ctx.create_event().unwrap();
    let done = ctx.create_event().unwrap();
    assert!(gate.check_destroy().is_ok(), "a fresh event is free");
    let l = ctx.create_immediate_command_list(&d0).unwrap();
    l.append_memory_fill(buf, &[7], 4 * KIB, Some(&done), &[&gate])
        .unwrap();
    let e = gate.check_destroy().unwrap_err();
    assert_eq!(e.ze_result(), 0x7800_0006, "{e}");
    assert!(e.message().contains("1 queued"), "{e}");
    // The signal the fill will send does not hold `done`.
    assert!(done.check_destroy().is_ok());
    // A clone is the same event: still in use.
    assert_eq!(code(gate.clone().check_destroy()), 0x7800_0006);
    gate.host_signal().unwrap();
    assert_eq!(done.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    l.host_synchronize(FOREVER).unwrap();
    assert!(gate.check_destroy().is_ok(), "the batch finished");
    // SAFETY: the fill has finished; the allocation is live.
    assert_eq!(dev_bytes(&ctx, buf, 4 * KIB)[4 * KIB - 1], 7);
    // A regular list that only records a wait does not hold the event.
    let rl = ctx.create_command_list(&d0).unwrap();
    rl.append_wait_on_events(&[&gate]).unwrap();
    assert!(gate.check_destroy().is_ok());
    ctx.free_memory(buf).unwrap();
}
