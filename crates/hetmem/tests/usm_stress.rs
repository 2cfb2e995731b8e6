//! Concurrency of USM allocations and device queues (issue 3): 8 threads allocate, free (every
//! policy, with work in flight), queue copies and fills on their own queues, on two queues all
//! threads share and on their own immediate lists, read other threads' allocations (which may
//! be freed under them), and tear down short-lived contexts whose memory queued work still
//! reads. Afterwards no byte of capacity, bookkeeping record, pending free, mapping, fd or
//! thread is left behind.
//!
//! Each thread checks the contents of its own allocations after each of its submissions has
//! signalled its event. The whole-process figures (`/proc/self/maps`, `/proc/self/fd`,
//! `/proc/self/task`) are taken around the run, so this test is alone in its binary.

mod common;

use common::{runtime_with, task_count, Rng};

use std::sync::{Barrier, Mutex};
use std::time::Instant;

use hetmem::platform::{mapping_count, open_fd_count};
use hetmem::{
    AllocDesc, CommandList, CommandQueue, Context, Device, Event, FreePolicy, MemoryType, Runtime,
    SyncStatus,
};

const THREADS: usize = 8;
const OPS: usize = 2_500;
const WARMUP_OPS: usize = 200;
const SEED: u64 = 0x4845_544d_454d_0003;
const MAX_OWN: usize = 8;
const SIZES: [usize; 5] = [4096, 65536, 100_000, 256 << 10, 1 << 20];

/// What every thread shares: the context, the devices, two shared queues and the published
/// allocations of all threads (base, size) that others may read.
struct Shared {
    ctx: Context,
    devs: Vec<Device>,
    queues: Vec<CommandQueue>,
    published: Mutex<Vec<(usize, usize)>>,
    /// Whether fresh allocations are checked to read zero (the host backend's).
    fresh_reads_zero: bool,
}

/// One allocation a thread owns, with the byte every position holds.
struct Own {
    base: usize,
    size: usize,
    byte: u8,
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    ops: [usize; 7],
    bytes_checked: usize,
    foreign_reads: usize,
    foreign_gone: usize,
}

struct Worker<'a> {
    sh: &'a Shared,
    rng: Rng,
    own: Vec<Own>,
    queue: CommandQueue,
    imm: CommandList,
    dev: Device,
    counts: Counts,
}

/// The `n` bytes at `p` as the device sees them (callers pass a live allocation of theirs with
/// no work in flight on it): read directly on the host backend, copied on cuda, where device
/// memory is not host-accessible.
fn bytes(ctx: &Context, p: usize, n: usize) -> Vec<u8> {
    common::dev_bytes(ctx, p, n)
}

/// Operations per thread: fewer on cuda, where every check is a device copy.
fn ops() -> usize {
    if common::on_cuda() {
        OPS / 8
    } else {
        OPS
    }
}

impl<'a> Worker<'a> {
    fn new(id: usize, sh: &'a Shared, seed: u64) -> Worker<'a> {
        let dev = sh.devs[id % sh.devs.len()].clone();
        Worker {
            sh,
            rng: Rng(seed ^ (id as u64).wrapping_mul(0x1234_5678_9abc_def1)),
            own: Vec::new(),
            queue: sh.ctx.create_command_queue(&dev).unwrap(),
            imm: sh.ctx.create_immediate_command_list(&dev).unwrap(),
            dev,
            counts: Counts::default(),
        }
    }

    fn run(mut self, ops: usize) -> Counts {
        for _ in 0..ops {
            let k = self.rng.below(7);
            self.counts.ops[k] += 1;
            match k {
                0 | 1 => self.alloc(),
                2 => self.free(),
                3 => self.fill_and_copy(),
                4 => self.foreign_read(),
                5 => self.context_churn(),
                _ => self.properties(),
            }
        }
        while !self.own.is_empty() {
            self.free();
        }
        self.counts
    }

    fn alloc(&mut self) {
        if self.own.len() >= MAX_OWN {
            return self.free();
        }
        let size = SIZES[self.rng.below(SIZES.len())];
        let desc = AllocDesc::new(size);
        let dev = &self.sh.devs[self.rng.below(self.sh.devs.len())];
        let r = match self.rng.below(3) {
            0 => self.sh.ctx.alloc_host(&desc),
            1 => self.sh.ctx.alloc_device(dev, &desc),
            _ => self.sh.ctx.alloc_shared(Some(dev), &desc),
        };
        let base = match r {
            Ok(b) => b,
            // Capacity is shared by 8 threads; running out is an answer, not a failure.
            Err(e) => {
                assert_eq!(e.ze_result(), 0x7000_0003, "{e}");
                return;
            }
        };
        // Fresh memory reads zero (on the host backend: nothing requires it on cuda).
        if self.sh.fresh_reads_zero {
            assert!(bytes(&self.sh.ctx, base, size).iter().all(|&b| b == 0));
        }
        self.own.push(Own {
            base,
            size,
            byte: 0,
        });
        self.sh.published.lock().unwrap().push((base, size));
    }

    fn free(&mut self) {
        if self.own.is_empty() {
            return;
        }
        let o = self.own.swap_remove(self.rng.below(self.own.len()));
        self.sh
            .published
            .lock()
            .unwrap()
            .retain(|&(b, _)| b != o.base);
        let policy = [
            FreePolicy::Immediate,
            FreePolicy::Blocking,
            FreePolicy::Defer,
        ][self.rng.below(3)];
        // Sometimes with work still in flight on it.
        if self.rng.below(2) == 0 {
            self.imm
                .append_memory_fill(o.base, &[0xEE], o.size, None, &[])
                .unwrap();
        }
        self.sh.ctx.free_memory_ext(o.base, policy).unwrap();
    }

    /// Submits `f`'s commands through a random engine (own queue, a shared queue or the own
    /// immediate list) and waits for their last event.
    fn submit(&mut self, f: impl Fn(&CommandList, &Event)) {
        let done = self.sh.ctx.create_event().unwrap();
        match self.rng.below(3) {
            0 => f(&self.imm, &done),
            w => {
                let q = if w == 1 {
                    &self.queue
                } else {
                    &self.sh.queues[self.rng.below(self.sh.queues.len())]
                };
                let l = self.sh.ctx.create_command_list(q.device()).unwrap();
                f(&l, &done);
                l.close().unwrap();
                q.execute_command_lists(&[&l], None).unwrap();
            }
        }
        assert_eq!(done.host_synchronize(u64::MAX).unwrap(), SyncStatus::Ready);
    }

    fn fill_and_copy(&mut self) {
        if self.own.len() < 2 {
            return self.alloc();
        }
        let a = self.rng.below(self.own.len());
        let b = (a + 1 + self.rng.below(self.own.len() - 1)) % self.own.len();
        let byte = (self.rng.next() as u8) | 1;
        let (pa, na) = (self.own[a].base, self.own[a].size);
        let (pb, nb) = (self.own[b].base, self.own[b].size);
        let n = na.min(nb);
        self.submit(|l, done| {
            l.append_memory_fill(pa, &[byte], na, None, &[]).unwrap();
            l.append_memory_copy(pb, pa, n, Some(done), &[]).unwrap();
        });
        self.own[a].byte = byte;
        let old_b = self.own[b].byte;
        let got = bytes(&self.sh.ctx, pb, nb);
        assert!(got[..n].iter().all(|&x| x == byte), "copied bytes");
        assert!(got[n..].iter().all(|&x| x == old_b), "bytes past the copy");
        assert!(
            bytes(&self.sh.ctx, pa, na).iter().all(|&x| x == byte),
            "filled bytes"
        );
        if n != nb {
            // Keep one byte per allocation: fill the rest too.
            self.submit(|l, done| {
                l.append_memory_fill(pb, &[byte], nb, Some(done), &[])
                    .unwrap();
            });
        }
        self.own[b].byte = byte;
        self.counts.bytes_checked += na + nb;
    }

    /// Copies from another thread's allocation, which may be freed at any moment: the append
    /// either fails cleanly or the copy runs on memory that stays valid until it finishes.
    fn foreign_read(&mut self) {
        let Some(dst) = self.own.iter().map(|o| (o.base, o.size)).next() else {
            return self.alloc();
        };
        let pick = {
            let p = self.sh.published.lock().unwrap();
            if p.is_empty() {
                return;
            }
            p[self.rng.below(p.len())]
        };
        let n = pick.1.min(dst.1);
        let r = self.imm.append_memory_copy(dst.0, pick.0, n, None, &[]);
        match r {
            Ok(()) => self.counts.foreign_reads += 1,
            Err(e) => {
                assert_eq!(e.ze_result(), 0x7800_0004, "{e}");
                self.counts.foreign_gone += 1;
            }
        }
        self.imm.host_synchronize(u64::MAX).unwrap();
        // Unknown contents now: restore the one-byte invariant.
        let o = &self.own[0];
        let (base, size, byte) = (o.base, o.size, o.byte);
        self.submit(|l, done| {
            l.append_memory_fill(base, &[byte], size, Some(done), &[])
                .unwrap();
        });
    }

    /// A short-lived context whose memory queued work still reads when it is dropped.
    fn context_churn(&mut self) {
        let Some(o) = self.own.first() else {
            return self.alloc();
        };
        let (dst, size) = (o.base, o.size.min(65536));
        let other = self.sh.ctx.driver().create_context().unwrap();
        let src = match other.alloc_device(&self.dev, &AllocDesc::new(size)) {
            Ok(p) => p,
            Err(e) => {
                assert_eq!(e.ze_result(), 0x7000_0003, "{e}");
                return;
            }
        };
        let gate = self.sh.ctx.create_event().unwrap();
        let done = self.sh.ctx.create_event().unwrap();
        let l = self.sh.ctx.create_command_list(&self.dev).unwrap();
        l.append_memory_fill(src, &[0x42], size, None, &[&gate])
            .unwrap();
        l.append_memory_copy(dst, src, size, Some(&done), &[])
            .unwrap();
        l.close().unwrap();
        self.queue.execute_command_lists(&[&l], None).unwrap();
        drop(other); // teardown with work in flight
        gate.host_signal().unwrap();
        done.host_synchronize(u64::MAX).unwrap();
        assert!(bytes(&self.sh.ctx, dst, size).iter().all(|&b| b == 0x42));
        let (base, n, byte) = (o.base, o.size, o.byte);
        self.submit(|l, done| {
            l.append_memory_fill(base, &[byte], n, Some(done), &[])
                .unwrap();
        });
    }

    fn properties(&mut self) {
        if let Some(o) = self.own.get(self.rng.below(self.own.len().max(1))) {
            let off = self.rng.below(o.size);
            let p = self.sh.ctx.get_allocation_properties(o.base + off).unwrap();
            assert_ne!(p.memory_type, MemoryType::Unknown);
            assert_eq!(
                self.sh.ctx.get_address_range(o.base + off).unwrap(),
                (o.base, o.size)
            );
            assert!(bytes(&self.sh.ctx, o.base, o.size)
                .iter()
                .all(|&b| b == o.byte));
            self.counts.bytes_checked += o.size;
        }
    }
}

fn run(sh: &Shared, ops: usize, seed: u64) -> Vec<Counts> {
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|id| {
                let start = &start;
                s.spawn(move || {
                    let w = Worker::new(id, sh, seed);
                    start.wait();
                    w.run(ops)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("a worker panicked"))
            .collect()
    })
}

fn assert_nothing_left(rt: &Runtime) {
    let d = rt.driver();
    assert_eq!(d.pending_frees(), 0);
    assert_eq!(d.usm_stats(), hetmem::UsmStats::default());
    assert!(d.devices().iter().all(|x| x.used_memory() == 0));
    let vm = d.vm_stats();
    assert_eq!((vm.reservations, vm.physical_objects), (0, 0), "{vm:?}");
    assert!(vm.devices.iter().all(|x| x.used == 0), "{vm:?}");
}

/// `count()` once it holds still for 100 ms (or reaches `want`), waiting at most 3 s: threads
/// that were joined or told to stop leave the process's task list a moment later.
fn settled(count: fn() -> usize, want: Option<usize>) -> usize {
    let start = Instant::now();
    let mut last = count();
    loop {
        if want == Some(last) || start.elapsed() > std::time::Duration::from_secs(3) {
            return last;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = count();
        if want.is_none() && now == last {
            return now;
        }
        last = now;
    }
}

#[test]
fn many_threads_allocating_freeing_and_queueing_leak_nothing() {
    if common::skip() {
        return;
    }
    let rt = runtime_with(2, 64 << 20);
    let fresh_reads_zero = !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "fresh allocations read zero: cuda device memory is not zero-filled, and nothing in the \
         spec requires it",
    );
    let make_shared = || {
        let ctx = rt.driver().create_context().unwrap();
        let devs = rt.driver().devices();
        let queues = devs
            .iter()
            .map(|d| ctx.create_command_queue(d).unwrap())
            .collect();
        Shared {
            ctx,
            devs,
            queues,
            published: Mutex::new(Vec::new()),
            fresh_reads_zero,
        }
    };
    // Warm up (the C library's per-thread arenas and cached stacks), then count.
    let sh = make_shared();
    run(&sh, WARMUP_OPS.min(ops()), !SEED);
    drop(sh);
    assert_nothing_left(&rt);
    let maps_before = mapping_count();
    let fds_before = open_fd_count();
    // Threads a dropped runtime object joined may still be leaving the task list: count once
    // the number holds still.
    let tasks_before = settled(task_count, None);

    let t = Instant::now();
    let sh = make_shared();
    let counts = run(&sh, ops(), SEED);
    drop(sh); // the shared queues join their engines, the context goes
    let took = t.elapsed();
    let sum = |f: fn(&Counts) -> usize| counts.iter().map(f).sum::<usize>();
    let per_kind = counts.iter().fold([0; 7], |mut a, c| {
        a.iter_mut().zip(c.ops).for_each(|(x, y)| *x += y);
        a
    });
    eprintln!(
        "{} operations on {THREADS} threads in {took:?} (seed {SEED:#x}): {} bytes checked, \
         {} foreign reads, {} foreign allocations gone; ops per kind {per_kind:?}",
        THREADS * ops(),
        sum(|c| c.bytes_checked),
        sum(|c| c.foreign_reads),
        sum(|c| c.foreign_gone),
    );
    assert!(sum(|c| c.bytes_checked) > 1 << 20);
    assert!(sum(|c| c.foreign_reads) > 100);

    assert_nothing_left(&rt);
    if !common::part_not_applicable_on(
        hetmem::BackendKind::Cuda,
        "the whole-process counts of fds, mappings and threads: on the host backend every one \
         is hetmem's (memfds, mmaps, engine threads); on cuda the driver opens descriptors, \
         maps memory and starts threads of its own as it pleases",
    ) {
        assert_eq!(open_fd_count(), fds_before, "leaked fds");
        assert_eq!(mapping_count(), maps_before, "leaked mappings");
        assert_eq!(
            settled(task_count, Some(tasks_before)),
            tasks_before,
            "leaked threads"
        );
    }
}
