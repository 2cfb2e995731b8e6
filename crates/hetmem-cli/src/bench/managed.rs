//! `hetmem bench managed`: ACL managed memory on the host backend. Fault-driven migration (the
//! host touches 1 GiB that lives on a device, one byte per 2 MiB page: one userfaultfd fault per
//! page), walking the pages in order and in a random order, and prefetch of 1 GiB each way; each
//! against a plain `memcpy` of the same bytes measured next to it in the same round. Then the
//! latency of one fault (p50 / p99, in order and in random order) against a `memcpy` of one
//! 2 MiB page. `--json` also gives `fault_sequential_staged_faults` and
//! `fault_random_staged_faults`: how many of the last round's faults found their page's bytes
//! staged ahead by the host backend's sequential-fault prefetcher (`ManagedStats::staged_installs`).
//!
//! The runtime copies pages with streaming (non-temporal) stores, as a copy engine would; the
//! "streaming page copy" row measures that copy alone against the same `memcpy`, so the share of
//! the ratios that comes from the copy primitive (rather than from the migration machinery) is
//! visible.
//!
//! Every row is measured with the managed memory on 4 KiB pages, then (rows marked `2M`, keys
//! ending `_huge`) on 2 MiB hugetlbfs pages where 512 reserved ones are free
//! (`vm.nr_hugepages`); the memcpy baseline is the same in both.

use std::time::Instant;

use hetmem::{Context, Location, Stream, MANAGED_PAGE_SIZE as PAGE};
use rustix::mm::{MapFlags, ProtFlags};

use super::{e2s, json_extra, median, Args, Row, Unit};

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

/// The pages of the allocation in a fixed pseudo-random order (Fisher-Yates over splitmix64, so
/// every run walks the same order).
fn shuffled(n: usize) -> Vec<usize> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        v.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    v
}

/// Touches one byte of each page of `m` in `order` (page indices), with the pages on a device;
/// returns the seconds it took and how many of the faults found their page's bytes staged ahead
/// (`ManagedStats::staged_installs`), and, if `lat`, each touch's nanoseconds. Checks every page
/// was migrated by a host fault of its own and read the bytes the allocation was filled with.
fn touch(
    rt: &hetmem::Runtime,
    m: usize,
    order: &[usize],
    lat: Option<&mut Vec<f64>>,
) -> Result<(f64, u64), String> {
    let before = rt.driver().managed_stats();
    let mut times = Vec::with_capacity(order.len());
    let t = Instant::now();
    let mut sum = 0u64;
    for &i in order {
        let t1 = Instant::now();
        // SAFETY: inside the live managed allocation.
        sum += unsafe { ((m + i * PAGE) as *const u8).read_volatile() } as u64;
        times.push(t1.elapsed().as_nanos() as f64);
    }
    let secs = t.elapsed().as_secs_f64();
    let after = rt.driver().managed_stats();
    let (faults, moved) = (
        after.host_faults - before.host_faults,
        after.pages_to_host - before.pages_to_host,
    );
    let n = order.len() as u64;
    if faults != n || moved != n || sum != 0x5a * n {
        return Err(format!(
            "expected {n} faults migrating {n} pages of bytes 0x5a, got {faults} faults, \
             {moved} pages, byte sum {sum:#x}"
        ));
    }
    if let Some(l) = lat {
        l.extend(times);
    }
    Ok((secs, after.staged_installs - before.staged_installs))
}

/// Both page kinds: 4 KiB pages (the rows' plain keys), then 2 MiB hugetlbfs pages where
/// enough reserved ones are free (keys and labels marked `2M`), each against its own memcpy.
pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let mut rows = pass(args, false)?;
    match super::huge_pages_available(Some((SIZE / PAGE) as u64)) {
        Ok(()) => {
            for r in pass(args, true)? {
                rows.push(Row {
                    op: super::leak(format!("{} 2M", r.op)),
                    key: format!("{}_huge", r.key),
                    ..r
                });
            }
        }
        Err(why) => println!("2 MiB-page rows not run: {why}"),
    }
    Ok(rows)
}

/// One pass of the group with 4 KiB pages or (`huge`) 2 MiB ones.
fn pass(args: &Args, huge: bool) -> Result<Vec<Row>, String> {
    let (rt, dev, ctx) = crate::common::one_device_pages(2 * SIZE as u64, huge)?;
    let s = ctx.create_stream(&dev).map_err(e2s)?;
    let m = ctx.alloc_managed(SIZE as u64, 1).map_err(e2s)?;
    ctx.managed_memset(m, 0x5a, SIZE).map_err(e2s)?;
    let src = Buf::new(SIZE, 1)?;
    let dst = Buf::new(SIZE, 2)?;
    let rounds = args.rounds.max(3);
    let pages = SIZE / PAGE;
    let in_order: Vec<usize> = (0..pages).collect();
    let random = shuffled(pages);

    // Per row: hetmem's seconds and the seconds of the memcpy measured just before it.
    let mut rows: [(Vec<f64>, Vec<f64>); 5] = Default::default();
    let (mut lat_seq, mut lat_rand, mut base_lat) = (Vec::new(), Vec::new(), Vec::new());
    // Faults of the last round's walks that found their bytes staged ahead.
    let (mut staged_seq, mut staged_rand) = (0, 0);
    // Warm-up: one migration each way.
    prefetch(&ctx, &s, m, Location::Device(0))?;
    prefetch(&ctx, &s, m, Location::Host)?;
    for r in 0..rounds {
        // 0: prefetch host -> device (pages are on the host).
        rows[0].1.push(memcpy_secs(&dst, &src, SIZE));
        let t = Instant::now();
        prefetch(&ctx, &s, m, Location::Device(0))?;
        rows[0].0.push(t.elapsed().as_secs_f64());
        // 1: fault-driven device -> host, pages in order.
        rows[1].1.push(memcpy_secs(&dst, &src, SIZE));
        let (secs, staged) = touch(&rt, m, &in_order, (r == 0).then_some(&mut lat_seq))?;
        rows[1].0.push(secs);
        staged_seq = staged;
        // 2: fault-driven device -> host, pages in a random order.
        prefetch(&ctx, &s, m, Location::Device(0))?;
        rows[2].1.push(memcpy_secs(&dst, &src, SIZE));
        let (secs, staged) = touch(&rt, m, &random, (r == 0).then_some(&mut lat_rand))?;
        rows[2].0.push(secs);
        staged_rand = staged;
        // 3: prefetch device -> host.
        prefetch(&ctx, &s, m, Location::Device(0))?;
        rows[3].1.push(memcpy_secs(&dst, &src, SIZE));
        let t = Instant::now();
        prefetch(&ctx, &s, m, Location::Host)?;
        rows[3].0.push(t.elapsed().as_secs_f64());
        // 4: the runtime's page copy alone.
        rows[4].1.push(memcpy_secs(&dst, &src, SIZE));
        let t = Instant::now();
        for o in (0..SIZE).step_by(PAGE) {
            // SAFETY: both buffers are ours, page-aligned and SIZE long; they do not overlap.
            unsafe { hetmem_linux::copy::stream_copy(dst.0 + o, src.0 + o, PAGE) };
        }
        rows[4].0.push(t.elapsed().as_secs_f64());
    }
    for i in 0..pages {
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
    let kind = if huge { "_huge" } else { "" };
    json_extra(
        &format!("fault_sequential_staged_faults{kind}"),
        staged_seq as f64,
    );
    json_extra(
        &format!("fault_random_staged_faults{kind}"),
        staged_rand as f64,
    );
    println!(
        "{} pages: faults that found their page staged ahead (last round): in order \
         {staged_seq} of {pages}, random {staged_rand} of {pages}",
        if huge { "2 MiB" } else { "4 KiB" }
    );
    let bw = |secs: f64| SIZE as f64 / secs / GIB;
    let [to_dev, seq, rand, to_host, stream] = rows.map(|(h, b)| (bw(median(h)), bw(median(b))));
    let row = |op, key: &str, (v, b): (f64, f64), target| Row {
        op,
        size: "1GiB",
        key: key.into(),
        unit: Unit::GiBps,
        hetmem_ns: v,
        baseline_ns: Some(b),
        baseline: "memcpy of the same bytes (pre-faulted)",
        target,
    };
    let latency = |op, key: &str, lat: &mut Vec<f64>, p: f64, baseline| Row {
        op,
        size: "2MiB",
        key: key.into(),
        unit: Unit::Ns,
        hetmem_ns: pct(lat, p),
        baseline_ns: Some(pct(&mut base_lat.clone(), p)),
        baseline,
        target: None,
    };
    Ok(vec![
        row(
            "fault to host, in order",
            "fault_sequential_1gib",
            seq,
            Some(">= 0.85x"),
        ),
        row(
            "fault to host, random",
            "fault_random_1gib",
            rand,
            Some(">= 0.85x"),
        ),
        row(
            "prefetch to device",
            "prefetch_to_device_1gib",
            to_dev,
            Some(">= 0.85x"),
        ),
        row(
            "prefetch to host",
            "prefetch_to_host_1gib",
            to_host,
            Some(">= 0.85x"),
        ),
        Row {
            baseline: "memcpy (reference: the runtime's page copy alone)",
            ..row(
                "streaming page copy",
                "stream_copy_1gib",
                stream,
                Some(">= 0.95x"),
            )
        },
        latency(
            "fault p50, in order",
            "fault_latency_p50_2mib",
            &mut lat_seq,
            0.5,
            "memcpy of one 2 MiB page, p50",
        ),
        latency(
            "fault p99, in order",
            "fault_latency_p99_2mib",
            &mut lat_seq,
            0.99,
            "memcpy of one 2 MiB page, p99",
        ),
        latency(
            "fault p50, random",
            "fault_random_latency_p50_2mib",
            &mut lat_rand,
            0.5,
            "memcpy of one 2 MiB page, p50",
        ),
        latency(
            "fault p99, random",
            "fault_random_latency_p99_2mib",
            &mut lat_rand,
            0.99,
            "memcpy of one 2 MiB page, p99",
        ),
    ])
}
