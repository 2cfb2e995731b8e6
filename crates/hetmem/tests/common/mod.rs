//! Shared by the integration tests (`mod common;` in each file that needs it): runtimes,
//! memory words and patterns, seeded random numbers, child processes (one-shot and line
//! protocol), process-wide counters, serialising locks, the memory layouts the IPC tests export
//! and the managed-memory attribute readers.
//!
//! Every test binary compiles the whole module and uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};

use hetmem::{
    AccessAttribute, AllocDesc, BackendKind, Context, Error, IpcHandle, PhysicalMemoryFlags,
    RangeAttribute, Reservation, Runtime, Stream,
};

pub const K64: usize = 64 << 10;
pub const MIB: usize = 1 << 20;

/// Level Zero result codes (`ze_result_t`) the tests expect.
pub mod ze {
    pub const OUT_OF_HOST_MEMORY: u32 = 0x7000_0002;
    pub const OUT_OF_DEVICE_MEMORY: u32 = 0x7000_0003;
    pub const INVALID_ARGUMENT: u32 = 0x7800_0004;
    pub const INVALID_NULL_HANDLE: u32 = 0x7800_0005;
    pub const HANDLE_OBJECT_IN_USE: u32 = 0x7800_0006;
    pub const INVALID_NULL_POINTER: u32 = 0x7800_0007;
    pub const INVALID_SIZE: u32 = 0x7800_0008;
    pub const UNSUPPORTED_SIZE: u32 = 0x7800_0009;
    pub const UNSUPPORTED_ALIGNMENT: u32 = 0x7800_000a;
    pub const INVALID_ENUMERATION: u32 = 0x7800_000c;
    pub const ADDRESS_NOT_FOUND: u32 = 0x7800_0021;
    pub const UNKNOWN: u32 = 0x7fff_fffe;
}

// ---------------------------------------------------------------------------------------------
// Runtimes and the backend under test
//
// The backend comes from `HETMEM_BACKEND` (`host`, the default, or `cuda`); every runtime the
// tests build through this module is on it. The `host_*` settings (device count, capacity,
// largest allocation) shape host devices only and are ignored on cuda, whose devices are the
// machine's GPUs.
//
// Every test starts with `if common::skip() { return; }`: where the chosen backend cannot start
// (cuda without an NVIDIA driver or GPU) it prints one `SKIPPED (<backend>) <test>: <reason>`
// line past the harness's capture and the test passes without running. A test (or part of one)
// that cannot apply to a backend says so through [`not_applicable_on`], with the reason, as one
// loud `NOT APPLICABLE (<backend>) <test>: <reason>` line. Nothing is skipped silently.

// The backend, the loud lines and the not-applicable and skipped printers are
// `hetmem_testkit`'s, shared with the other crates' tests; re-exported here under the names
// the test files use. `not_applicable_on` is checked before `skip`'s availability where it
// guards a whole test, so the count of not-applicable tests is the same on every machine.
// (Each test binary uses a part of them.)
#[allow(unused_imports)]
pub use hetmem_testkit::{
    backend, loud, not_applicable_on, on_cuda, on_host, part_not_applicable_on, test_name,
};
use hetmem_testkit::{loud_once, skipped};

/// Why the chosen backend cannot start on this machine, if it cannot (asked once per process).
/// Only cuda can fail that way, and only with `Uninitialized`; anything else fails the test.
pub fn backend_unavailable() -> Option<String> {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        if on_host() {
            return None;
        }
        match Runtime::builder().backend(backend()).build() {
            Ok(_) => None,
            Err(e) => {
                assert!(
                    matches!(e, Error::Uninitialized(_)),
                    "the {} backend failed with something other than Uninitialized: {e:?}",
                    backend().name()
                );
                Some(e.message().to_string())
            }
        }
    })
    .clone()
}

/// The first line of every test: true (the test returns and passes) after one loud
/// `SKIPPED (<backend>) <test>: <reason>` line when the chosen backend cannot start here.
pub fn skip() -> bool {
    match backend_unavailable() {
        None => false,
        Some(why) => {
            skipped(&why);
            true
        }
    }
}

/// True on the host backend; elsewhere false after a loud [`part_not_applicable_on`] line for
/// the kernel-side checks of device mappings (`/proc/self/maps` lines and permissions), which
/// exist only where device memory is host memory mapped by the runtime itself.
pub fn kernel_maps_apply() -> bool {
    !part_not_applicable_on(
        BackendKind::Cuda,
        "the /proc/self/maps checks of device mappings: on cuda device memory is mapped by the \
         driver in the GPU's address space, not by host mmap, so the kernel shows no such lines",
    )
}

/// The first line of every test of a file that runs on the host backend only as a whole: on any
/// other backend, one loud line for the whole binary (`NOT APPLICABLE (<backend>) <binary>:
/// <reason>`) and every test returns.
pub fn file_not_applicable(reason: &str) -> bool {
    if on_host() {
        return false;
    }
    let exe = std::env::current_exe().ok();
    let bin = exe
        .as_ref()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bin = bin
        .rsplit_once('-')
        .map(|(b, _)| b.to_string())
        .unwrap_or(bin);
    loud_once(format!(
        "NOT APPLICABLE ({}) {bin} (whole file): {reason}",
        backend().name()
    ));
    true
}

/// The first line of every test of a file not yet made backend-parametric (it still runs on
/// the host backend only): on any other backend one loud line for the whole binary, then as
/// [`skip`].
pub fn not_yet_parametric() -> bool {
    file_not_applicable("not yet made backend-parametric") || skip()
}

/// True (after a loud not-applicable line) when the runtime has fewer than `n` devices: on the
/// host backend the test asks for them; on cuda they are the machine's GPUs.
pub fn fewer_devices_than(rt: &Runtime, n: usize) -> bool {
    let have = rt.driver().device_list().len();
    if have >= n {
        return false;
    }
    not_applicable_on(
        backend(),
        &format!("needs {n} devices; this machine has {have}"),
    )
}

/// A builder on the backend under test.
pub fn builder() -> hetmem::RuntimeBuilder {
    Runtime::builder().backend(backend())
}

/// One device (on the host backend, of 256 MiB).
pub fn runtime() -> Runtime {
    runtime_with(1, 256 << 20)
}

/// `devices` host devices of `device_memory` bytes each (on cuda: the machine's GPUs).
pub fn runtime_with(devices: u32, device_memory: u64) -> Runtime {
    builder()
        .host_devices(devices)
        .host_device_memory(device_memory)
        .build()
        .expect("runtime")
}

/// [`runtime_with`], with `max_alloc` bytes as the largest single allocation (host only).
pub fn runtime_with_max_alloc(devices: u32, device_memory: u64, max_alloc: u64) -> Runtime {
    builder()
        .host_devices(devices)
        .host_device_memory(device_memory)
        .host_max_alloc_size(max_alloc)
        .build()
        .expect("runtime")
}

/// [`runtime_with`] and a context of it.
pub fn context_with(devices: u32, device_memory: u64) -> (Runtime, Context) {
    let rt = runtime_with(devices, device_memory);
    let ctx = rt.driver().create_context().expect("context");
    (rt, ctx)
}

/// The virtual-memory page size of device 0 for `size` bytes (`zeVirtualMemQueryPageSize`):
/// on the host backend 64 KiB below 2 MiB and 2 MiB from 2 MiB, on cuda the driver's
/// granularity (2 MiB) for every size.
pub fn page_for(ctx: &Context, size: usize) -> usize {
    let dev = ctx.driver().device(0).expect("device 0");
    ctx.query_page_size(&dev, size).expect("page size")
}

/// The base page of device 0 (`page_for(ctx, 1)`): the unit of map, unmap and access calls.
pub fn page(ctx: &Context) -> usize {
    page_for(ctx, 1)
}

// ---------------------------------------------------------------------------------------------
// Memory words and patterns

/// Writes the word at `addr`. The caller passes memory it mapped writable (or, in a child
/// process that checks faults, memory whose fault kills the child as the test expects).
pub fn write(addr: usize, v: u64) {
    // SAFETY: as the caller guarantees (see above).
    unsafe { (addr as *mut u64).write_volatile(v) }
}

/// Reads the word at `addr`. The caller passes memory it mapped readable (or, as for
/// [`write`], memory whose fault is the point of the test).
pub fn read(addr: usize) -> u64 {
    // SAFETY: as the caller guarantees (see above).
    unsafe { (addr as *const u64).read_volatile() }
}

/// The byte at `p` (memory the caller mapped readable).
pub fn byte(p: usize) -> u8 {
    // SAFETY: the caller passes readable memory.
    unsafe { (p as *const u8).read_volatile() }
}

/// Word `i` (every 8 bytes) of a view holds `seed ^ offset`.
pub fn fill(ptr: usize, size: usize, seed: u64) {
    for off in (0..size).step_by(8) {
        write(ptr + off, seed ^ off as u64);
    }
}

/// First offset where the pattern of `seed` is not found, if any.
pub fn check(ptr: usize, size: usize, seed: u64) -> Option<usize> {
    (0..size)
        .step_by(8)
        .find(|&off| read(ptr + off) != seed ^ off as u64)
}

// ---------------------------------------------------------------------------------------------
// Device memory as the device sees it
//
// On the host backend device memory is host memory, read and written directly (as above). On
// cuda the host cannot reach device memory: these go through the runtime's own copies, on an
// immediate command list of device 0, between the range and a host USM staging buffer. Memory
// the host reaches on both backends (host USM, shared USM, managed memory, host physical
// memory) may use the direct helpers above.

/// `(offset, length)` pieces of `[at, at+n)` cut at the backend's page boundaries.
fn page_chunks(ctx: &Context, at: usize, n: usize) -> Vec<(usize, usize)> {
    let p = page(ctx);
    let mut out = Vec::new();
    let mut off = 0;
    while off < n {
        let len = (p - (at + off) % p).min(n - off);
        out.push((off, len));
        off += len;
    }
    if out.is_empty() {
        out.push((0, 0));
    }
    out
}

/// `n` bytes at `src` as the device sees them.
pub fn dev_bytes(ctx: &Context, src: usize, n: usize) -> Vec<u8> {
    if on_host() {
        // SAFETY: the caller passes memory mapped readable on the host backend.
        return unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
    }
    let host = ctx
        .alloc_host(&AllocDesc::new(n.max(1)))
        .expect("staging host USM");
    let dev = ctx.driver().device(0).expect("device 0");
    let list = ctx.create_immediate_command_list(&dev).expect("list");
    // One copy per page: a copy operand lies in one reservation, and a range (an IPC range
    // export, say) may span several adjacent ones.
    for (off, len) in page_chunks(ctx, src, n) {
        list.append_memory_copy(host + off, src + off, len, None, &[])
            .expect("copy from device memory");
    }
    list.host_synchronize(u64::MAX).expect("sync");
    // SAFETY: host USM memory of n bytes, written by the finished copy.
    let out = unsafe { std::slice::from_raw_parts(host as *const u8, n) }.to_vec();
    ctx.free_memory(host).expect("free staging");
    out
}

/// Writes `data` at `dst` as the device would.
pub fn dev_put(ctx: &Context, dst: usize, data: &[u8]) {
    if on_host() {
        // SAFETY: the caller passes memory mapped writable on the host backend.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
        return;
    }
    let n = data.len();
    let host = ctx
        .alloc_host(&AllocDesc::new(n.max(1)))
        .expect("staging host USM");
    // SAFETY: host USM memory of n bytes.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host as *mut u8, n) };
    let dev = ctx.driver().device(0).expect("device 0");
    let list = ctx.create_immediate_command_list(&dev).expect("list");
    for (off, len) in page_chunks(ctx, dst, n) {
        list.append_memory_copy(dst + off, host + off, len, None, &[])
            .expect("copy to device memory");
    }
    list.host_synchronize(u64::MAX).expect("sync");
    ctx.free_memory(host).expect("free staging");
}

/// [`write`] of device memory.
pub fn dev_write(ctx: &Context, addr: usize, v: u64) {
    if on_host() {
        return write(addr, v);
    }
    dev_put(ctx, addr, &v.to_ne_bytes());
}

/// [`read`] of device memory.
pub fn dev_read(ctx: &Context, addr: usize) -> u64 {
    if on_host() {
        return read(addr);
    }
    u64::from_ne_bytes(dev_bytes(ctx, addr, 8).try_into().unwrap())
}

/// [`byte`] of device memory.
pub fn dev_byte(ctx: &Context, p: usize) -> u8 {
    if on_host() {
        return byte(p);
    }
    dev_bytes(ctx, p, 1)[0]
}

/// [`fill`] of device memory (one copy on cuda).
pub fn dev_fill(ctx: &Context, ptr: usize, size: usize, seed: u64) {
    if on_host() {
        return fill(ptr, size, seed);
    }
    let mut b = Vec::with_capacity(size);
    for off in (0..size).step_by(8) {
        let w = (seed ^ off as u64).to_ne_bytes();
        b.extend_from_slice(&w[..8.min(size - off)]);
    }
    dev_put(ctx, ptr, &b);
}

/// [`check`] of device memory (one copy on cuda).
pub fn dev_check(ctx: &Context, ptr: usize, size: usize, seed: u64) -> Option<usize> {
    if on_host() {
        return check(ptr, size, seed);
    }
    let b = dev_bytes(ctx, ptr, size);
    (0..size / 8 * 8)
        .step_by(8)
        .find(|&off| u64::from_ne_bytes(b[off..off + 8].try_into().unwrap()) != seed ^ off as u64)
}

// ---------------------------------------------------------------------------------------------
// Seeded random numbers

/// SplitMix64: small, seedable, good enough to pick operations.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes: the test binary runs itself again, one test selected

/// The variable that tells a child which case of `child_case_runner` to run.
pub const CHILD_CASE: &str = "HETMEM_CHILD_CASE";

/// The case this process runs as a child (`HETMEM_CHILD_CASE`), if it is one.
pub fn child_case() -> Option<String> {
    std::env::var(CHILD_CASE).ok()
}

/// A command that runs test `test` of this test binary alone (exact name, one test thread,
/// output not captured).
pub fn test_in_child(test: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("current_exe"));
    c.args(["--exact", test, "--nocapture", "--test-threads=1"]);
    c
}

/// Runs test `test` of this binary alone in a child with `env` set and returns how it went.
pub fn run_test_in_child(test: &str, env: &[(&str, &str)]) -> Output {
    let mut c = test_in_child(test);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("spawn child")
}

/// A child's stdout then stderr, as text.
pub fn output_text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A child running `child_case_runner` of this binary with case `case`, talking over lines
/// of its stdin and stdout (never sleeps).
pub struct Proc {
    pub child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Proc {
    pub fn spawn(case: &str, env: &[(&str, String)]) -> Proc {
        let mut c = test_in_child("child_case_runner");
        c.arg("-q")
            .env(CHILD_CASE, case)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            c.env(k, v);
        }
        let mut child = c.spawn().expect("spawn child");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Proc { child, stdin, out }
    }
    /// The next line the child printed that starts with `@` (the harness prints others).
    pub fn line(&mut self) -> String {
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).unwrap() == 0 {
                panic!("child ended early: {:?}", self.child.wait());
            }
            if let Some(m) = l.strip_prefix('@') {
                return m.trim().to_string();
            }
        }
    }
    pub fn say(&mut self, s: &str) {
        writeln!(self.stdin, "{s}").unwrap();
        self.stdin.flush().unwrap();
    }
    /// Closes the child's stdin and waits for it; it must succeed.
    pub fn finish(mut self) {
        drop(self.stdin);
        let st = self.child.wait().unwrap();
        assert!(st.success(), "child failed: {st}");
    }
    /// `SIGKILL`s the child and reaps it.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

/// The child's side of [`Proc::say`]: the next line of stdin, trimmed.
pub fn read_stdin_line() -> String {
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    l.trim().to_string()
}

/// Variable `k` of the environment, or empty.
pub fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// A fresh path in the temporary directory, unique to this process and call.
pub fn temp(name: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("hetmem-test-{}-{n}-{name}", std::process::id()))
}

// ---------------------------------------------------------------------------------------------
// Process-wide counters and serialising locks

/// Threads of this process.
pub fn task_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Locks `m`, also after a test that held it panicked (its assertion failed already).
pub fn lock(m: &'static Mutex<()>) -> MutexGuard<'static, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Managed memory

/// A stream of device `d`.
pub fn stream(rt: &Runtime, ctx: &Context, d: u32) -> Stream {
    ctx.create_stream(&rt.driver().device(d).unwrap()).unwrap()
}

/// A 4-byte attribute of `[p, p+s)`.
pub fn attr(ctx: &Context, a: RangeAttribute, p: usize, s: usize) -> i32 {
    ctx.managed_attr_i32(a, p, s).unwrap()
}

/// The seven 4-byte attributes, in value order (ACCESSED_BY separately).
pub fn scalars(ctx: &Context, p: usize, s: usize) -> [i32; 7] {
    use RangeAttribute as A;
    let a = |x| attr(ctx, x, p, s);
    [
        a(A::ReadMostly),
        a(A::PreferredLocation),
        a(A::PreferredLocationType),
        a(A::PreferredLocationId),
        a(A::LastPrefetchLocation),
        a(A::LastPrefetchLocationType),
        a(A::LastPrefetchLocationId),
    ]
}

// ---------------------------------------------------------------------------------------------
// IPC: handles and the memory layouts the tests export

/// The handle written to file `path`.
pub fn read_handle(path: &str) -> IpcHandle {
    let b = std::fs::read(path).unwrap();
    IpcHandle::from_bytes(b.try_into().expect("64 bytes"))
}

/// FNV-1a over bytes 4..60 into 60..64: the checksum catches corruption, not forgery.
pub fn reseal(h: &mut IpcHandle) {
    let mut x: u32 = 0x811c_9dc5;
    for &b in &h.data[4..60] {
        x ^= b as u32;
        x = x.wrapping_mul(0x0100_0193);
    }
    h.data[60..64].copy_from_slice(&x.to_le_bytes());
}

/// The seed of the pattern the allocation of [`child_export_alloc`] holds.
pub const EXPORTED_SEED: u64 = 0xabcd;

/// A child's part: exports a 1 MiB allocation holding the pattern of [`EXPORTED_SEED`],
/// writes its handle to the file named by `FILE`, sends the handle's fd over the Unix socket
/// named by `SOCK` if set, says `@ready`, then, if `wait`, waits for a line of stdin (returned);
/// then puts the handle and frees the allocation.
pub fn child_export_alloc(ctx: &Context, wait: bool) -> String {
    use std::os::fd::AsFd;
    let e = make_alloc(ctx);
    dev_fill(ctx, e.ptr, e.size, EXPORTED_SEED);
    let h = ctx.get_ipc_handle(e.ptr).unwrap();
    std::fs::write(env("FILE"), h.as_bytes()).unwrap();
    if !env("SOCK").is_empty() {
        let s = std::os::unix::net::UnixStream::connect(env("SOCK")).unwrap();
        // SAFETY: the handle's fd is open in this process until put.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(h.fd()) };
        send_fds(s.as_fd(), b"x", &[fd]).unwrap();
    }
    println!("@ready");
    let line = if wait {
        read_stdin_line()
    } else {
        String::new()
    };
    ctx.put_ipc_handle(&h).unwrap();
    e.destroy(ctx);
    line
}

/// Spawns child case `case`, an exporter of [`child_export_alloc`] that sends its fd, and
/// takes that fd. Returns the child (it said `@ready`), the fd and the handle's file (the
/// caller removes it).
pub fn spawn_exporter_sending_fd(case: &str) -> (Proc, std::os::fd::OwnedFd, PathBuf) {
    use std::os::fd::AsFd;
    let file = temp("handle");
    let sock = temp("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let mut c = Proc::spawn(
        case,
        &[
            ("FILE", file.display().to_string()),
            ("SOCK", sock.display().to_string()),
        ],
    );
    let (conn, _) = listener.accept().unwrap();
    let mut b = [0u8; 1];
    let (_, mut fds) = recv_fds(conn.as_fd(), &mut b, 1).unwrap();
    let fd = fds.pop().unwrap();
    assert_eq!(c.line(), "ready");
    let _ = std::fs::remove_file(&sock);
    (c, fd, file)
}

/// What an exporter made: the contiguous exporter view `[ptr, ptr+size)` and what to tear down.
pub struct Exported {
    pub ptr: usize,
    pub size: usize,
    pub reservations: Vec<Reservation>,
    pub objects: Vec<hetmem::PhysicalMemory>,
    pub alloc: Option<usize>,
}

/// A device allocation of 1 MiB.
pub fn make_alloc(ctx: &Context) -> Exported {
    let dev = ctx.driver().device(0).unwrap();
    let p = ctx.alloc_device(&dev, &AllocDesc::new(1 << 20)).unwrap();
    Exported {
        ptr: p,
        size: 1 << 20,
        reservations: vec![],
        objects: vec![],
        alloc: Some(p),
    }
}

/// One 2 MiB physical object mapped whole in a reservation.
pub fn make_physical(ctx: &Context) -> Exported {
    let dev = ctx.driver().device(0).unwrap();
    let size = 2 << 20;
    let r = ctx.reserve(None, size).unwrap();
    let o = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, size)
        .unwrap();
    ctx.map(r.base, size, o, 0, AccessAttribute::ReadWrite)
        .unwrap();
    Exported {
        ptr: r.base,
        size,
        reservations: vec![r],
        objects: vec![o],
        alloc: None,
    }
}

/// Three adjacent reservations of 16 base pages (1 MiB on the host backend, whose base page is
/// 64 KiB) holding 7 physical objects of 8 pages, mostly mapped at non-zero offsets; the range
/// starts 1 page into the first object and stops 3 pages before the end of the third
/// reservation (whose tail stays unmapped: `hole` is its first byte). Returns the exported
/// range plus `hole`. The unit is [`page`] (2 MiB on cuda).
pub fn make_range(ctx: &Context) -> (Exported, usize) {
    let dev = ctx.driver().device(0).unwrap();
    let u = page(ctx);
    let m = 16 * u;
    let rs = adjacent_reservations(ctx, 3, m);
    let objects: Vec<_> = (0..7)
        .map(|_| {
            ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 8 * u)
                .unwrap()
        })
        .collect();
    // (reservation, offset in it, object, offset in object, length), in base pages.
    let plan = [
        (0, 0, 0, 2, 4),
        (0, 4, 1, 1, 6),
        (0, 10, 2, 0, 6),
        (1, 0, 3, 0, 8),
        (1, 8, 4, 1, 7),
        (1, 15, 5, 7, 1),
        (2, 0, 6, 1, 7),
    ];
    for &(r, at, o, off, len) in &plan {
        ctx.map(
            rs[r].base + at * u,
            len * u,
            objects[o],
            off * u,
            AccessAttribute::ReadWrite,
        )
        .unwrap();
    }
    let ptr = rs[0].base + u;
    let hole = rs[2].base + 7 * u;
    (
        Exported {
            ptr,
            size: hole - ptr,
            reservations: rs,
            objects,
            alloc: None,
        },
        hole,
    )
}

/// `n` reservations of `size` bytes each, back to back.
pub fn adjacent_reservations(ctx: &Context, n: usize, size: usize) -> Vec<Reservation> {
    for _ in 0..100 {
        let probe = ctx
            .reserve(None, (n * size).next_multiple_of(2 << 20))
            .unwrap();
        ctx.free_reservation(probe).unwrap();
        let mut rs = Vec::new();
        for i in 0..n {
            match ctx.reserve(Some(probe.base + i * size), size) {
                Ok(r) if r.base == probe.base + i * size => rs.push(r),
                Ok(r) => {
                    ctx.free_reservation(r).unwrap();
                    break;
                }
                Err(_) => break,
            }
        }
        if rs.len() == n {
            return rs;
        }
        for r in rs {
            ctx.free_reservation(r).unwrap();
        }
    }
    panic!("no room for {n} adjacent reservations");
}

impl Exported {
    pub fn destroy(self, ctx: &Context) {
        for r in self.reservations {
            ctx.free_reservation(r).unwrap();
        }
        for o in self.objects {
            ctx.destroy_physical_memory(o).unwrap();
        }
        if let Some(p) = self.alloc {
            ctx.free_memory(p).unwrap();
        }
    }
}

/// Sends `payload` with `fds` attached over a Unix socket (`sendmsg(2)` + `SCM_RIGHTS`), as a
/// Level Zero program passes the fd of an IPC handle to another process itself.
pub fn send_fds(
    sock: std::os::fd::BorrowedFd<'_>,
    payload: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> rustix::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    assert!(fds.is_empty() || control.push(SendAncillaryMessage::ScmRights(fds)));
    rustix::net::sendmsg(
        sock,
        &[std::io::IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// Receives one message and up to `max_fds` fds (`recvmsg(2)`, `MSG_CMSG_CLOEXEC`): the bytes
/// received (0 at end of stream) and the fds.
pub fn recv_fds(
    sock: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
    max_fds: usize,
) -> rustix::io::Result<(usize, Vec<std::os::fd::OwnedFd>)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space =
        vec![std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(max_fds.max(1)))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        sock,
        &mut [std::io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(it) = m {
            fds.extend(it);
        }
    }
    Ok((msg.bytes, fds))
}

/// Connects to the abstract `SOCK_SEQPACKET` socket `name` (an IPC broker's) and sends
/// nothing: an idle peer.
pub fn connect_abstract(name: &str) -> rustix::io::Result<std::os::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let s = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::net::connect(&s, &SocketAddrUnix::new_abstract_name(name.as_bytes())?)?;
    Ok(s)
}
