//! `hetmem bench managed`: ACL managed memory on the host backend. Fault-driven migration (the
//! host touches 1 GiB that lives on a device: one userfaultfd fault per 2 MiB page) and
//! prefetch of 1 GiB each way, against a plain `memcpy` of the same bytes in the same run; and
//! the latency of one fault (p50 / p99) against a `memcpy` of one 2 MiB page.
//!
//! The runtime copies pages with streaming (non-temporal) stores, as a copy engine would; the
//! last row measures that copy alone against the same `memcpy`, so the share of the ratios that
//! comes from the copy primitive (rather than from the migration machinery) is visible.

use std::time::Instant;

use hetmem::{Context, Location, Stream, MANAGED_PAGE_SIZE as PAGE};
use rustix::mm::{MapFlags, ProtFlags};

use super::{e2s, median, Args, Row, Unit};

const SIZE: usize = 1 << 30;
const GIB: f64 = (1u64 << 30) as f64;

/// A pre-faulted anonymous buffer for the memcpy baseline.
struct Buf(usize, usize);

impl Buf {
    fn new(len: usize, fill: u8) -> Result<Buf, String> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(|e| e.to_string())? as usize;
        // SAFETY: our own mapping, writable.
        unsafe { std::ptr::write_bytes(p as *mut u8, fill, len) };
        Ok(Buf(p, len))
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { rustix::mm::munmap(self.0 as *mut _, self.1).ok() };
    }
}

fn memcpy_secs(dst: &Buf, src: &Buf, len: usize) -> f64 {
    let t = Instant::now();
    // SAFETY: both buffers are ours and at least `len` long.
    unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.0 as *mut u8, len) };
    t.elapsed().as_secs_f64()
}

fn prefetch(ctx: &Context, s: &Stream, m: usize, to: Location) -> Result<(), String> {
    ctx.mem_prefetch(m, SIZE, to, 0, s).map_err(e2s)?;
    s.synchronize().map_err(e2s)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let (rt, dev, ctx) = crate::common::one_device(2 * SIZE as u64)?;
    let s = ctx.create_stream(&dev).map_err(e2s)?;
    let m = ctx.alloc_managed(SIZE as u64, 1).map_err(e2s)?;
    ctx.managed_memset(m, 0x5a, SIZE).map_err(e2s)?;
    let src = Buf::new(SIZE, 1)?;
    let dst = Buf::new(SIZE, 2)?;
    let rounds = args.rounds.max(3);

    let (mut touch, mut to_dev, mut to_host, mut base) = (vec![], vec![], vec![], vec![]);
    let mut stream = Vec::new();
    let (mut lat, mut base_lat) = (Vec::new(), Vec::new());
    // Warm-up: one migration each way.
    prefetch(&ctx, &s, m, Location::Device(0))?;
    prefetch(&ctx, &s, m, Location::Host)?;
    for r in 0..rounds {
        base.push(memcpy_secs(&dst, &src, SIZE));
        // Prefetch host -> device (pages are on the host).
        let t = Instant::now();
        prefetch(&ctx, &s, m, Location::Device(0))?;
        to_dev.push(t.elapsed().as_secs_f64());
        // Fault-driven device -> host: touch one byte per 2 MiB page.
        let before = rt.driver().managed_stats().host_faults;
        let t = Instant::now();
        let mut sum = 0u64;
        for p in (m..m + SIZE).step_by(PAGE) {
            let t1 = Instant::now();
            // SAFETY: inside the live managed allocation.
            sum += unsafe { (p as *const u8).read_volatile() } as u64;
            if r == 0 {
                lat.push(t1.elapsed().as_nanos() as f64);
            }
        }
        touch.push(t.elapsed().as_secs_f64());
        let faults = rt.driver().managed_stats().host_faults - before;
        if faults != (SIZE / PAGE) as u64 || sum != 0x5a * (SIZE / PAGE) as u64 {
            return Err(format!(
                "expected {} faults and bytes 0x5a, got {faults}",
                SIZE / PAGE
            ));
        }
        // Prefetch device -> host.
        prefetch(&ctx, &s, m, Location::Device(0))?;
        let t = Instant::now();
        prefetch(&ctx, &s, m, Location::Host)?;
        to_host.push(t.elapsed().as_secs_f64());
        base.push(memcpy_secs(&dst, &src, SIZE));
        let t = Instant::now();
        for o in (0..SIZE).step_by(PAGE) {
            // SAFETY: both buffers are ours, page-aligned and SIZE long; they do not overlap.
            unsafe { hetmem::platform::stream_copy(dst.0 + o, src.0 + o, PAGE) };
        }
        stream.push(t.elapsed().as_secs_f64());
    }
    for i in 0..(SIZE / PAGE) {
        let t = Instant::now();
        // SAFETY: inside both buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (src.0 + i * PAGE) as *const u8,
                (dst.0 + i * PAGE) as *mut u8,
                PAGE,
            )
        };
        base_lat.push(t.elapsed().as_nanos() as f64);
    }
    ctx.free_managed(m).map_err(e2s)?;
    let st = rt.driver().managed_stats();
    tracing::debug!("managed bench counters: {st:?}");
    let bw = |secs: f64| SIZE as f64 / secs / GIB;
    let b = bw(median(base));
    let row = |op, key: &str, v: f64, target| Row {
        op,
        size: "1GiB",
        key: key.into(),
        unit: Unit::GiBps,
        hetmem_ns: v,
        baseline_ns: Some(b),
        baseline: "memcpy of the same bytes (pre-faulted)",
        target,
    };
    Ok(vec![
        row(
            "fault-driven to host",
            "fault_migrate_1gib",
            bw(median(touch)),
            Some(">= 0.5x"),
        ),
        row(
            "prefetch to device",
            "prefetch_to_device_1gib",
            bw(median(to_dev)),
            Some(">= 0.8x"),
        ),
        row(
            "prefetch to host",
            "prefetch_to_host_1gib",
            bw(median(to_host)),
            Some(">= 0.8x"),
        ),
        Row {
            baseline: "memcpy (reference: the runtime's page copy alone)",
            ..row(
                "streaming page copy",
                "stream_copy_1gib",
                bw(median(stream)),
                None,
            )
        },
        Row {
            op: "fault latency p50",
            size: "2MiB",
            key: "fault_latency_p50_2mib".into(),
            unit: Unit::Ns,
            hetmem_ns: pct(&mut lat, 0.5),
            baseline_ns: Some(pct(&mut base_lat, 0.5)),
            baseline: "memcpy of one 2 MiB page, p50",
            target: None,
        },
        Row {
            op: "fault latency p99",
            size: "2MiB",
            key: "fault_latency_p99_2mib".into(),
            unit: Unit::Ns,
            hetmem_ns: pct(&mut lat, 0.99),
            baseline_ns: Some(pct(&mut base_lat, 0.99)),
            baseline: "memcpy of one 2 MiB page, p99",
            target: None,
        },
    ])
}
