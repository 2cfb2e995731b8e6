//! In-flight work on virtual-memory mappings and opened IPC views (see "Virtual memory and IPC
//! views in flight" in `hetmem::queue`): unmap, reservation free, access changes, context
//! teardown and IPC close block until the queued copies and fills that use the memory have
//! finished; unrelated calls do not wait. Without the rule, the engine thread would touch
//! unmapped memory and the process would die with SIGSEGV.
//!
//! On the backend under test (`HETMEM_BACKEND`). The mappings are of host physical memory,
//! which the host reaches on both backends; device allocations are read through the runtime's
//! own copies (`dev_bytes`) on cuda, where the host cannot reach them.

mod common;

use common::runtime_with;

use std::sync::mpsc;

use hetmem::{
    AccessAttribute, AllocDesc, CommandQueue, Context, Device, Event, PhysicalMemory,
    PhysicalMemoryFlags, Reservation, Runtime, SyncStatus,
};

const MIB: usize = 1 << 20;
/// Long enough that the copy is still running well after the gate opens.
const BIG: usize = 256 * MIB;
const FOREVER: u64 = u64::MAX;

fn setup() -> (Runtime, Device, Context) {
    let rt = runtime_with(1, 1 << 30);
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    (rt, dev, ctx)
}

/// A reservation of `size` bytes with one host physical object mapped read-write over it.
fn mapping(ctx: &Context, size: usize) -> (Reservation, PhysicalMemory) {
    let r = ctx.reserve(None, size).unwrap();
    let p = ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, size)
        .unwrap();
    ctx.map(r.base, size, p, 0, AccessAttribute::ReadWrite)
        .unwrap();
    (r, p)
}

/// # Safety: `[p, p+n)` is live host-accessible memory.
unsafe fn bytes<'a>(p: usize, n: usize) -> &'a mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
}

fn pattern(i: usize) -> u8 {
    (i % 251) as u8
}

fn write_pattern(p: usize, n: usize) {
    // SAFETY: callers pass live read-write memory.
    for (i, b) in unsafe { bytes(p, n) }.iter_mut().enumerate() {
        *b = pattern(i);
    }
}

/// [`has_pattern`] of device memory (the runtime's copies on cuda).
fn dev_has_pattern(ctx: &Context, p: usize, n: usize) -> bool {
    common::dev_bytes(ctx, p, n)
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(i))
}

fn has_pattern(p: usize, n: usize) -> bool {
    // SAFETY: callers pass live readable memory.
    unsafe { bytes(p, n) }
        .iter()
        .enumerate()
        .all(|(i, &b)| b == pattern(i))
}

/// Queues `dst <- src` (BIG bytes) on `q` behind a fresh gate event, signalling a fresh done
/// event; returns `(gate, done)`.
fn queue_copy(
    ctx: &Context,
    q: &CommandQueue,
    dev: &Device,
    dst: usize,
    src: usize,
) -> (Event, Event) {
    let gate = ctx.create_event().unwrap();
    let done = ctx.create_event().unwrap();
    let l = ctx.create_command_list(dev).unwrap();
    l.append_memory_copy(dst, src, BIG, Some(&done), &[&gate])
        .unwrap();
    l.close().unwrap();
    q.execute_command_lists(&[&l], None).unwrap();
    // The list may go: the batch keeps its own copy of the commands.
    drop(l);
    (gate, done)
}

/// Runs `call` on another thread; once it is blocked waiting for in-flight work (a real
/// signal: the driver's waiter count), opens the gate. Returns whether `done` was signalled
/// when `call` returned, and `call`'s result.
fn blocked_until_done<T: Send + 'static>(
    rt: &Runtime,
    gate: &Event,
    done: &Event,
    call: impl FnOnce() -> T + Send + 'static,
) -> (bool, T) {
    let (tx, rx) = mpsc::channel();
    let done2 = done.clone();
    let t = std::thread::spawn(move || {
        let r = call();
        let ready = done2.query_status().unwrap() == SyncStatus::Ready;
        tx.send(()).unwrap();
        (ready, r)
    });
    while rt.driver().in_flight_waiters() == 0 {
        assert!(
            rx.try_recv().is_err(),
            "the call returned while the copy was still queued"
        );
        std::thread::yield_now();
    }
    assert_eq!(done.query_status().unwrap(), SyncStatus::NotReady);
    gate.host_signal().unwrap();
    let out = t.join().unwrap();
    assert_eq!(rt.driver().in_flight_waiters(), 0);
    out
}

#[test]
fn unmap_waits_for_a_queued_copy_into_the_mapping() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let src = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    write_pattern(src, BIG);
    let (r, p) = mapping(&ctx, BIG);
    let q = ctx.create_command_queue(&dev).unwrap();
    let (gate, done) = queue_copy(&ctx, &q, &dev, r.base, src);
    let c2 = ctx.clone();
    let (ready, res) = blocked_until_done(&rt, &gate, &done, move || c2.unmap(r.base, BIG));
    res.unwrap();
    assert!(ready, "unmap returned before the copy finished");
    // The bytes landed in the physical object: map it again and look.
    ctx.map(r.base, BIG, p, 0, AccessAttribute::ReadOnly)
        .unwrap();
    assert!(has_pattern(r.base, BIG));
    ctx.unmap(r.base, BIG).unwrap();
    ctx.destroy_physical_memory(p).unwrap();
    ctx.free_reservation(r).unwrap();
    ctx.free_memory(src).unwrap();
}

#[test]
fn reservation_free_waits_for_a_queued_copy_out_of_the_mapping() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let dst = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    let (r, p) = mapping(&ctx, BIG);
    write_pattern(r.base, BIG);
    let q = ctx.create_command_queue(&dev).unwrap();
    let (gate, done) = queue_copy(&ctx, &q, &dev, dst, r.base);
    let c2 = ctx.clone();
    let (ready, res) = blocked_until_done(&rt, &gate, &done, move || c2.free_reservation(r));
    res.unwrap();
    assert!(ready, "free returned before the copy finished");
    assert!(has_pattern(dst, BIG));
    assert_eq!(rt.driver().vm_stats().reservations, 0);
    ctx.destroy_physical_memory(p).unwrap();
    ctx.free_memory(dst).unwrap();
}

#[test]
fn access_change_waits_for_a_queued_copy_out_of_the_mapping() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let dst = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    let (r, p) = mapping(&ctx, BIG);
    write_pattern(r.base, BIG);
    let q = ctx.create_command_queue(&dev).unwrap();
    let (gate, done) = queue_copy(&ctx, &q, &dev, dst, r.base);
    let c2 = ctx.clone();
    let (ready, res) = blocked_until_done(&rt, &gate, &done, move || {
        c2.set_access_attribute(r.base, BIG, AccessAttribute::None)
    });
    res.unwrap();
    assert!(ready, "the access change returned before the copy finished");
    assert!(has_pattern(dst, BIG));
    ctx.unmap(r.base, BIG).unwrap();
    ctx.destroy_physical_memory(p).unwrap();
    ctx.free_reservation(r).unwrap();
    ctx.free_memory(dst).unwrap();
}

#[test]
fn context_teardown_waits_for_another_contexts_queued_copy_into_its_mapping() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let owner = rt.driver().create_context().unwrap();
    let src = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    write_pattern(src, BIG);
    let (r, _p) = mapping(&owner, BIG);
    let q = ctx.create_command_queue(&dev).unwrap();
    let (gate, done) = queue_copy(&ctx, &q, &dev, r.base, src);
    // And a fill into the owner's mapping, on the same queue, after the copy.
    let l = ctx.create_command_list(&dev).unwrap();
    let filled = ctx.create_event().unwrap();
    l.append_memory_fill(r.base, &[0x5a], MIB, Some(&filled), &[])
        .unwrap();
    l.close().unwrap();
    q.execute_command_lists(&[&l], None).unwrap();
    let (ready, ()) = blocked_until_done(&rt, &gate, &done, move || drop(owner));
    assert!(ready, "context teardown returned before the copy finished");
    assert_eq!(filled.query_status().unwrap(), SyncStatus::Ready);
    let st = rt.driver().vm_stats();
    assert_eq!((st.reservations, st.physical_objects), (0, 0));
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    ctx.free_memory(src).unwrap();
}

#[test]
fn unrelated_vm_calls_do_not_wait_for_queued_work() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let src = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    let size = 64 * MIB;
    let r = ctx.reserve(None, 2 * size).unwrap();
    let p = ctx
        .create_physical_memory(None, PhysicalMemoryFlags::AllocateOnHost, 2 * size)
        .unwrap();
    ctx.map(r.base, size, p, 0, AccessAttribute::ReadWrite)
        .unwrap();
    let q = ctx.create_command_queue(&dev).unwrap();
    let gate = ctx.create_event().unwrap();
    let l = ctx.create_command_list(&dev).unwrap();
    l.append_memory_copy(r.base, src, size, None, &[&gate])
        .unwrap();
    l.close().unwrap();
    q.execute_command_lists(&[&l], None).unwrap();
    // Another reservation: its whole life goes on while the copy is queued.
    let (other, po) = mapping(&ctx, 4 * MIB);
    ctx.set_access_attribute(other.base, 2 * MIB, AccessAttribute::ReadOnly)
        .unwrap();
    ctx.unmap(other.base, 4 * MIB).unwrap();
    ctx.free_reservation(other).unwrap();
    ctx.destroy_physical_memory(po).unwrap();
    // Mapping more of the busy reservation does not touch the copy's pages: no wait.
    ctx.map(r.base + size, size, p, size, AccessAttribute::ReadWrite)
        .unwrap();
    // Bad input on the busy reservation's neighbourhood still fails at once.
    assert!(ctx.unmap(r.end(), 2 * MIB).is_err());
    // Destroying the mapped physical object stays HandleObjectInUse, without waiting.
    assert_eq!(
        ctx.destroy_physical_memory(p).unwrap_err().ze_result(),
        0x7800_0006
    );
    assert_eq!(rt.driver().in_flight_waiters(), 0);
    gate.host_signal().unwrap();
    assert_eq!(q.synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    ctx.free_reservation(r).unwrap();
    ctx.destroy_physical_memory(p).unwrap();
    ctx.free_memory(src).unwrap();
}

#[test]
fn ipc_view_is_a_copy_and_fill_operand_in_both_directions() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let size = 4 * MIB;
    let a = ctx.alloc_device(&dev, &AllocDesc::new(size)).unwrap();
    let h = ctx.get_ipc_handle(a).unwrap();
    let view = ctx.open_ipc_handle(&h, 0).unwrap();
    let host = ctx.alloc_host(&AllocDesc::new(size)).unwrap();
    write_pattern(host, size);
    let l = ctx.create_immediate_command_list(&dev).unwrap();
    // Into the view: the exporter's allocation sees it.
    l.append_memory_copy(view, host, size, None, &[]).unwrap();
    assert_eq!(l.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(dev_has_pattern(&ctx, a, size));
    // Out of the view.
    // SAFETY: a live host allocation of `size` bytes.
    unsafe { bytes(host, size) }.fill(0);
    l.append_memory_copy(host, view, size, None, &[]).unwrap();
    l.append_memory_fill(view, &[7, 9], 2 * MIB, None, &[])
        .unwrap();
    assert_eq!(l.host_synchronize(FOREVER).unwrap(), SyncStatus::Ready);
    assert!(has_pattern(host, size));
    assert!(common::dev_bytes(&ctx, a, 2 * MIB)
        .chunks(2)
        .all(|c| c == [7, 9]));
    // Past the view's end is still InvalidArgument.
    assert_eq!(
        l.append_memory_copy(view + MIB, host, size, None, &[])
            .unwrap_err()
            .ze_result(),
        0x7800_0004
    );
    ctx.close_ipc_handle(view).unwrap();
    // A closed view is no operand.
    assert!(l.append_memory_copy(view, host, MIB, None, &[]).is_err());
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_memory(a).unwrap();
    ctx.free_memory(host).unwrap();
}

#[test]
fn ipc_close_waits_for_a_queued_copy_into_the_view() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let a = ctx.alloc_device(&dev, &AllocDesc::new(BIG)).unwrap();
    let h = ctx.get_ipc_handle(a).unwrap();
    let view = ctx.open_ipc_handle(&h, 0).unwrap();
    let src = ctx.alloc_host(&AllocDesc::new(BIG)).unwrap();
    write_pattern(src, BIG);
    let q = ctx.create_command_queue(&dev).unwrap();
    let (gate, done) = queue_copy(&ctx, &q, &dev, view, src);
    let c2 = ctx.clone();
    let (ready, res) = blocked_until_done(&rt, &gate, &done, move || c2.close_ipc_handle(view));
    res.unwrap();
    assert!(ready, "close returned before the copy finished");
    assert!(dev_has_pattern(&ctx, a, BIG));
    ctx.put_ipc_handle(&h).unwrap();
    ctx.free_memory(a).unwrap();
    ctx.free_memory(src).unwrap();
}
