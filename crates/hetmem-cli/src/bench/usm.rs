//! `hetmem bench usm`: USM allocations and device queues against the raw work they need.
//!
//! - **allocate + free** (host and device; 64 KiB, 2 MiB, 64 MiB) against exactly the syscalls
//!   the host backend makes for them: `memfd_create`, `ftruncate`, `F_ADD_SEALS`, an aligned
//!   `mmap(PROT_NONE)` placeholder (with `munmap` of the slack), `mmap(MAP_SHARED | MAP_FIXED)`;
//!   then `munmap` and `close`. Ratio: time / baseline time (lower is better).
//! - **queue copy** host->device, device->host, device->device at 64 MiB and 1 GiB: a closed
//!   command list executed on a queue and synchronized, against a plain `memcpy` of the same
//!   bytes between the same two buffers on the calling thread. Both sides touch every page
//!   first, so both measure copies, not page faults. Ratio: bandwidth / memcpy bandwidth
//!   (target >= 0.8).
//! - **queue copy malloc->device, device->malloc, fill malloc** at 64 MiB: the same closed
//!   list with a `malloc`'d operand (plain system memory, Level Zero case 1) against the same
//!   list with a USM host operand. Ratio: malloc bandwidth / USM bandwidth (JSON
//!   `copy_malloc2d_64mib_ratio`, `copy_d2malloc_64mib_ratio`, `fill_malloc_64mib_ratio`;
//!   target >= 0.9).
//! - **queue fill** (1-byte pattern) at 64 MiB and 1 GiB against `memset` of the same bytes,
//!   and a 16-byte pattern at 64 MiB against the same `memset` (what a pattern costs). Ratio as
//!   for copies.
//! - **submit-to-complete latency** of an empty closed command list on a queue
//!   (`zeCommandQueueExecuteCommandLists` + `zeCommandQueueSynchronize`) against the bare
//!   mechanism of a host engine: a boxed closure sent through an `mpsc` channel to a worker
//!   thread that runs it and wakes the caller through a mutex + condvar. Ratio: time / baseline
//!   time.

use std::hint::black_box;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hetmem::{AllocDesc, CommandList, CommandQueue, Context, Device, Runtime};
use rustix::mm::{MapFlags, ProtFlags};

use super::{alternate, e2s, raw_memfd, raw_release, raw_reserve, Args, Row, Unit};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn size_label(s: usize) -> &'static str {
    match s {
        0x1_0000 => "64KiB",
        0x20_0000 => "2MiB",
        0x400_0000 => "64MiB",
        0x4000_0000 => "1GiB",
        _ => "?",
    }
}

fn key(op: &str, s: usize) -> String {
    format!("{op}_{}", size_label(s).to_ascii_lowercase())
}

pub fn bench(args: &Args) -> Result<Vec<Row>, String> {
    let rt = Runtime::builder()
        .host_devices(2)
        .host_device_memory(2 << 30)
        .build()
        .map_err(e2s)?;
    let d0 = rt.driver().device(0).ok_or("no device 0")?;
    let d1 = rt.driver().device(1).ok_or("no device 1")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    let mut rows = Vec::new();
    for size in [64 * KIB, 2 * MIB, 64 * MIB] {
        rows.push(alloc_free(&ctx, &d0, args, size, false)?);
        rows.push(alloc_free(&ctx, &d0, args, size, true)?);
    }
    rows.extend(copies_and_fills(&ctx, &d0, &d1, args)?);
    rows.push(empty_list_latency(&ctx, &d0, args)?);
    Ok(rows)
}

/// The host backend's allocation, as raw syscalls: a sealed memfd, an aligned placeholder, the
/// memfd mapped over it. Returns (address, memfd).
fn raw_alloc(size: usize, align: usize) -> Result<(usize, std::os::fd::OwnedFd), String> {
    let fd = raw_memfd(size)?;
    let addr = raw_reserve(size, align)?;
    // SAFETY: MAP_FIXED over our own fresh placeholder; the memfd is `size` bytes.
    unsafe {
        rustix::mm::mmap(
            addr as *mut _,
            size,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::FIXED,
            &fd,
            0,
        )
    }
    .map_err(|e| e.to_string())?;
    Ok((addr, fd))
}

fn alloc_free(
    ctx: &Context,
    dev: &Device,
    args: &Args,
    size: usize,
    device: bool,
) -> Result<Row, String> {
    let n = args.iters;
    // The alignment the library uses: the page size for the size.
    let page = ctx.query_page_size(dev, size).map_err(e2s)?;
    let desc = AllocDesc::new(size);
    let (h, b) = alternate(
        args.rounds,
        || {
            let t = Instant::now();
            for _ in 0..n {
                let p = if device {
                    ctx.alloc_device(dev, &desc)
                } else {
                    ctx.alloc_host(&desc)
                }
                .map_err(e2s)?;
                ctx.free_memory(black_box(p)).map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
        || {
            let t = Instant::now();
            for _ in 0..n {
                let (p, fd) = raw_alloc(size, page)?;
                raw_release(black_box(p), size);
                drop(fd);
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
    )?;
    Ok(Row {
        unit: Unit::Ns,
        op: if device {
            "alloc+free device"
        } else {
            "alloc+free host"
        },
        size: size_label(size),
        key: key(
            if device {
                "alloc_free_device"
            } else {
                "alloc_free_host"
            },
            size,
        ),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "memfd+ftruncate+seals+mmap x2 / munmap+close",
        target: None,
    })
}

/// GiB/s of `bytes` moved in `ns`.
fn gibps(bytes: usize, ns: f64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64 / (ns / 1e9)
}

/// Times `reps` executions of a closed list on `q`, each synchronized; returns GiB/s.
fn run_list(q: &CommandQueue, l: &CommandList, bytes: usize, reps: usize) -> Result<f64, String> {
    let t = Instant::now();
    for _ in 0..reps {
        q.execute_command_lists(&[l], None).map_err(e2s)?;
        q.synchronize(u64::MAX).map_err(e2s)?;
    }
    Ok(gibps(bytes * reps, t.elapsed().as_nanos() as f64))
}

/// `alternate` returns medians of whatever the rounds return; here GiB/s.
fn bandwidth_row(
    op: &'static str,
    keyop: &str,
    size: usize,
    h: f64,
    b: f64,
    baseline: &'static str,
) -> Row {
    Row {
        unit: Unit::GiBps,
        op,
        size: size_label(size),
        key: key(keyop, size),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline,
        target: Some(">= 0.8x"),
    }
}

fn copies_and_fills(
    ctx: &Context,
    d0: &Device,
    d1: &Device,
    args: &Args,
) -> Result<Vec<Row>, String> {
    let big = AllocDesc::new(GIB).relaxed_max_size(true);
    let host = ctx.alloc_host(&big).map_err(e2s)?;
    let dev0 = ctx.alloc_device(d0, &big).map_err(e2s)?;
    let dev1 = ctx.alloc_device(d1, &big).map_err(e2s)?;
    // Pre-touch every page of every buffer (both sides use the same buffers).
    for (i, p) in [host, dev0, dev1].into_iter().enumerate() {
        // SAFETY: live read-write allocations of 1 GiB.
        unsafe { std::ptr::write_bytes(p as *mut u8, i as u8 + 1, GIB) };
    }
    let q = ctx.create_command_queue(d0).map_err(e2s)?;
    let mut rows = Vec::new();
    let pairs = [
        ("copy host->device", "copy_h2d", dev0, host),
        ("copy device->host", "copy_d2h", host, dev0),
        ("copy device->device", "copy_d2d", dev1, dev0),
    ];
    for size in [64 * MIB, GIB] {
        // About 1 GiB per round.
        let reps = (GIB / size).max(1);
        for &(op, k, dst, src) in &pairs {
            let l = ctx.create_command_list(d0).map_err(e2s)?;
            l.append_memory_copy(dst, src, size, None, &[])
                .map_err(e2s)?;
            l.close().map_err(e2s)?;
            let (h, b) = alternate(
                args.rounds,
                || run_list(&q, &l, size, reps),
                || {
                    let t = Instant::now();
                    for _ in 0..reps {
                        // SAFETY: two distinct live allocations of at least `size` bytes.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                black_box(src) as *const u8,
                                black_box(dst) as *mut u8,
                                size,
                            )
                        };
                    }
                    Ok(gibps(size * reps, t.elapsed().as_nanos() as f64))
                },
            )?;
            rows.push(bandwidth_row(op, k, size, h, b, "memcpy of the same bytes"));
        }
        if size == 64 * MIB {
            rows.extend(malloc_rows(ctx, d0, &q, args, host, dev0, size, reps)?);
        }
        let fills: &[(&'static str, &str, usize)] = if size == GIB {
            &[("fill 1-byte pattern", "fill", 1)]
        } else {
            &[
                ("fill 1-byte pattern", "fill", 1),
                ("fill 16-byte pattern", "fill16", 16),
            ]
        };
        for &(op, k, plen) in fills {
            let pattern: Vec<u8> = (0..plen as u8).map(|i| i.wrapping_mul(17) | 1).collect();
            let l = ctx.create_command_list(d0).map_err(e2s)?;
            l.append_memory_fill(dev0, &pattern, size, None, &[])
                .map_err(e2s)?;
            l.close().map_err(e2s)?;
            let (h, b) = alternate(
                args.rounds,
                || run_list(&q, &l, size, reps),
                || {
                    let t = Instant::now();
                    for _ in 0..reps {
                        // SAFETY: a live allocation of at least `size` bytes.
                        unsafe { std::ptr::write_bytes(black_box(dev0) as *mut u8, 0x5a, size) };
                    }
                    Ok(gibps(size * reps, t.elapsed().as_nanos() as f64))
                },
            )?;
            rows.push(bandwidth_row(op, k, size, h, b, "memset of the same bytes"));
        }
    }
    drop(q);
    for p in [host, dev0, dev1] {
        ctx.free_memory(p).map_err(e2s)?;
    }
    Ok(rows)
}

/// The malloc-operand rows (see the module docs): each closed list with a `malloc`'d operand
/// against the same list with the USM host allocation `host`, on the same queue.
#[allow(clippy::too_many_arguments)]
pub(crate) fn malloc_rows(
    ctx: &Context,
    d0: &Device,
    q: &CommandQueue,
    args: &Args,
    host: usize,
    dev: usize,
    size: usize,
    reps: usize,
) -> Result<Vec<Row>, String> {
    // Touched on allocation (a non-zero value is written), as the USM side was.
    let sys = vec![3u8; size];
    let sp = sys.as_ptr() as usize;
    let list = |f: &dyn Fn(&CommandList) -> hetmem::Result<()>| -> Result<CommandList, String> {
        let l = ctx.create_command_list(d0).map_err(e2s)?;
        f(&l).map_err(e2s)?;
        l.close().map_err(e2s)?;
        Ok(l)
    };
    let pattern = [0x5au8];
    let cases: [(&'static str, &str, CommandList, CommandList); 3] = [
        (
            "copy malloc->device",
            "copy_malloc2d",
            list(&|l| l.append_memory_copy(dev, sp, size, None, &[]))?,
            list(&|l| l.append_memory_copy(dev, host, size, None, &[]))?,
        ),
        (
            "copy device->malloc",
            "copy_d2malloc",
            list(&|l| l.append_memory_copy(sp, dev, size, None, &[]))?,
            list(&|l| l.append_memory_copy(host, dev, size, None, &[]))?,
        ),
        (
            "fill malloc 1-byte pattern",
            "fill_malloc",
            list(&|l| l.append_memory_fill(sp, &pattern, size, None, &[]))?,
            list(&|l| l.append_memory_fill(host, &pattern, size, None, &[]))?,
        ),
    ];
    let mut rows = Vec::new();
    for (op, k, lm, lu) in &cases {
        let (h, b) = alternate(
            args.rounds,
            || run_list(q, lm, size, reps),
            || run_list(q, lu, size, reps),
        )?;
        rows.push(Row {
            target: Some(">= 0.9x"),
            ..bandwidth_row(op, k, size, h, b, "the same list with a USM host operand")
        });
    }
    black_box(&sys);
    Ok(rows)
}

/// The bare mechanism of a host engine: a worker thread fed boxed closures through a channel,
/// each signalling a mutex + condvar that the caller waits on.
struct RawHandoff {
    tx: Option<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    done: Arc<(Mutex<u64>, Condvar)>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl RawHandoff {
    fn new() -> RawHandoff {
        let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let worker = std::thread::spawn(move || {
            while let Ok(f) = rx.recv() {
                f();
            }
        });
        RawHandoff {
            tx: Some(tx),
            done: Arc::new((Mutex::new(0), Condvar::new())),
            worker: Some(worker),
        }
    }

    /// One round trip: submit a closure that bumps the counter, wait until it has.
    fn round_trip(&self, seq: u64) {
        let done = self.done.clone();
        let f: Box<dyn FnOnce() + Send> = Box::new(move || {
            *done.0.lock().unwrap() = seq;
            done.1.notify_all();
        });
        self.tx.as_ref().unwrap().send(f).unwrap();
        let mut g = self.done.0.lock().unwrap();
        while *g < seq {
            g = self.done.1.wait(g).unwrap();
        }
    }
}

impl Drop for RawHandoff {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn empty_list_latency(ctx: &Context, dev: &Device, args: &Args) -> Result<Row, String> {
    let n = args.iters.max(1) * 8;
    let l = ctx.create_command_list(dev).map_err(e2s)?;
    l.close().map_err(e2s)?;
    // A wake-up costs very different times depending on whether the two threads share a CPU
    // and how deeply the other CPU sleeps, and the scheduler keeps a placement for a while:
    // each round therefore starts a fresh engine (queue) or a fresh raw worker, and three
    // times as many rounds count.
    let (h, b) = alternate(
        args.rounds * 3,
        || {
            let q = ctx.create_command_queue(dev).map_err(e2s)?;
            let t = Instant::now();
            for _ in 0..n {
                q.execute_command_lists(&[&l], None).map_err(e2s)?;
                q.synchronize(u64::MAX).map_err(e2s)?;
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
        || {
            let raw = RawHandoff::new();
            let t = Instant::now();
            for seq in 1..=n as u64 {
                raw.round_trip(seq);
            }
            Ok(t.elapsed().as_nanos() as f64 / n as f64)
        },
    )?;
    Ok(Row {
        unit: Unit::Ns,
        op: "empty list submit+sync",
        size: "-",
        key: "empty_list_latency".into(),
        hetmem_ns: h,
        baseline_ns: Some(b),
        baseline: "closure via mpsc to a thread + condvar wake",
        target: None,
    })
}
