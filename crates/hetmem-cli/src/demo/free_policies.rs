//! The `free-policies` scene: the three policies of `zeMemFreeExt` on real in-flight work.
//!
//! A 512 MiB copy from host memory into a device allocation is queued on a device, and the
//! device allocation is freed while the copy is queued or running:
//! - **BLOCKING_FREE**: the free returns only after the copy's event is signalled;
//! - **DEFER_FREE**: the free returns at once; the device capacity comes back only when the
//!   copy has finished (the copy waits behind an event the scene opens after the free, so the
//!   order is certain, not a race);
//! - **free now** (policy 0): the free returns at once with the capacity back; a new 512 MiB
//!   allocation made at once never overlaps the memory the copy still writes, and its contents
//!   survive the copy.
//!
//! The scene runs on the host backend with one device of 1 GiB, whatever the environment says,
//! and fails (non-zero exit) if any of these promises is broken.

use std::time::{Duration, Instant};

use hetmem::{AllocDesc, Context, Device, Event, FreePolicy, SyncStatus};

use crate::info::human;

const MIB: usize = 1 << 20;
/// The copy's size.
const SIZE: usize = 512 * MIB;

use crate::common::e2s;

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

/// A device destination and a queued copy into it from `src` that waits on `gate` (if any) and
/// signals `done`.
struct Copy {
    dst: usize,
    done: Event,
    q: hetmem::CommandQueue,
}

fn queue_copy(
    ctx: &Context,
    dev: &Device,
    src: usize,
    gate: Option<&Event>,
) -> Result<Copy, String> {
    let dst = ctx.alloc_device(dev, &AllocDesc::new(SIZE)).map_err(e2s)?;
    let q = ctx.create_command_queue(dev).map_err(e2s)?;
    let done = ctx.create_event().map_err(e2s)?;
    let l = ctx.create_command_list(dev).map_err(e2s)?;
    let wait: Vec<&Event> = gate.into_iter().collect();
    l.append_memory_copy(dst, src, SIZE, Some(&done), &wait)
        .map_err(e2s)?;
    l.close().map_err(e2s)?;
    q.execute_command_lists(&[&l], None).map_err(e2s)?;
    Ok(Copy { dst, done, q })
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("free-policies: broken promise: {what}"))
    }
}

pub fn run(backend: Option<&str>) -> Result<(), String> {
    let (rt, dev, ctx) = crate::common::scene_runtime(backend, 1 << 30)?;
    let cap = dev.info().capacity;
    println!(
        "free policies (zeMemFreeExt) on a queued {} copy host -> device; device capacity {}; \
         the driver supports policies {:#x} (BLOCKING_FREE | DEFER_FREE)",
        human(SIZE as u64),
        human(cap),
        rt.driver().memory_free_policies()
    );
    let used = |what: &str, t: Duration| {
        println!(
            "    {:>11}  device used {:>9}  {what}",
            ms(t),
            human(dev.used_memory())
        );
    };

    // The source of every copy, touched once.
    let src = ctx.alloc_host(&AllocDesc::new(SIZE)).map_err(e2s)?;
    // SAFETY: a live read-write allocation of SIZE bytes, no work in flight yet.
    unsafe { std::ptr::write_bytes(src as *mut u8, 0xC0, SIZE) };

    // BLOCKING_FREE.
    println!("BLOCKING_FREE: the free waits for the copy");
    let c = queue_copy(&ctx, &dev, src, None)?;
    let t0 = Instant::now();
    used("copy queued", t0.elapsed());
    ctx.free_memory_ext(c.dst, FreePolicy::Blocking)
        .map_err(e2s)?;
    let returned = t0.elapsed();
    let signalled = c.done.query_status().map_err(e2s)? == SyncStatus::Ready;
    used("free returned", returned);
    println!(
        "    the copy's event was {} when the free returned",
        if signalled {
            "signalled"
        } else {
            "NOT signalled"
        }
    );
    check(
        signalled,
        "BLOCKING returned before the copy's event was signalled",
    )?;
    check(dev.used_memory() == 0, "BLOCKING left capacity held")?;
    drop(c.q);

    // DEFER_FREE.
    println!("DEFER_FREE: the free returns at once, the capacity comes back after the copy");
    let gate = ctx.create_event().map_err(e2s)?;
    let c = queue_copy(&ctx, &dev, src, Some(&gate))?;
    let t0 = Instant::now();
    used("copy queued (behind a gate)", t0.elapsed());
    ctx.free_memory_ext(c.dst, FreePolicy::Defer).map_err(e2s)?;
    let returned = t0.elapsed();
    let held = dev.used_memory();
    used("free returned; pointer already invalid", returned);
    check(
        c.done.query_status().map_err(e2s)? == SyncStatus::NotReady,
        "DEFER's copy finished before its gate opened",
    )?;
    check(held == SIZE as u64, "DEFER gave the capacity back early")?;
    check(
        ctx.get_allocation_properties(c.dst)
            .map_err(e2s)?
            .memory_type
            == hetmem::MemoryType::Unknown,
        "DEFER left the pointer valid",
    )?;
    gate.host_signal().map_err(e2s)?;
    let opened = t0.elapsed();
    used("gate opened: the copy runs", opened);
    // Capacity over time, until it is back.
    let mut last = held;
    let mut back = None;
    while back.is_none() {
        let u = dev.used_memory();
        if u != last {
            used("capacity released", t0.elapsed());
            last = u;
        }
        if u == 0 {
            back = Some(t0.elapsed());
        } else if t0.elapsed() > Duration::from_secs(60) {
            return Err("free-policies: DEFER never gave the capacity back".into());
        } else {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
    c.done.host_synchronize(u64::MAX).map_err(e2s)?;
    println!(
        "    the free took {}, the capacity came back {} after the gate opened",
        ms(returned),
        ms(back.unwrap() - opened)
    );
    check(
        c.done.query_status().map_err(e2s)? == SyncStatus::Ready,
        "copy not done",
    )?;
    drop(c.q);

    // Free now.
    println!("free now (policy 0): the free returns at once with the capacity back; the engine finishes safely");
    let gate = ctx.create_event().map_err(e2s)?;
    let c = queue_copy(&ctx, &dev, src, Some(&gate))?;
    let t0 = Instant::now();
    used("copy queued (behind a gate)", t0.elapsed());
    ctx.free_memory_ext(c.dst, FreePolicy::Immediate)
        .map_err(e2s)?;
    let returned = t0.elapsed();
    used("free returned", returned);
    check(dev.used_memory() == 0, "free now kept the capacity")?;
    let again = ctx.alloc_device(&dev, &AllocDesc::new(SIZE)).map_err(e2s)?;
    used("a new allocation took the capacity at once", t0.elapsed());
    let io = crate::common::DeviceBytes::new(&ctx, &dev)?;
    io.write(again, &vec![0x77; SIZE])?;
    let disjoint = again + SIZE <= c.dst || again >= c.dst + SIZE;
    println!(
        "    the new allocation is at {again:#x}, the freed one at {:#x}: {}",
        c.dst,
        if disjoint { "disjoint" } else { "OVERLAPPING" }
    );
    check(disjoint, "a new allocation overlaps memory the copy writes")?;
    gate.host_signal().map_err(e2s)?;
    c.q.synchronize(u64::MAX).map_err(e2s)?;
    used("the copy finished", t0.elapsed());
    let mut intact = true;
    io.visit(again, SIZE, |b| intact &= b.iter().all(|&x| x == 0x77))?;
    drop(io);
    println!(
        "    the new allocation's {} are {} after the copy",
        human(SIZE as u64),
        if intact { "intact" } else { "CORRUPTED" }
    );
    check(intact, "the engine wrote into a later allocation")?;
    check(
        rt.driver().pending_frees() == 0,
        "a free is still pending after the copy",
    )?;
    ctx.free_memory(again).map_err(e2s)?;
    drop(c.q);
    ctx.free_memory(src).map_err(e2s)?;
    check(
        dev.used_memory() == 0 && rt.driver().usm_stats() == hetmem::UsmStats::default(),
        "memory left behind",
    )?;
    println!("free policies: OK (BLOCKING waited, DEFER deferred, free-now was safe)");
    Ok(())
}
