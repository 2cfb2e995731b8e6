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
    AccessAttribute, AllocDesc, Context, IpcHandle, PhysicalMemoryFlags, RangeAttribute,
    Reservation, Runtime, Stream,
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
// Runtimes

/// One host device of 256 MiB.
pub fn runtime() -> Runtime {
    runtime_with(1, 256 << 20)
}

/// `devices` host devices of `device_memory` bytes each.
pub fn runtime_with(devices: u32, device_memory: u64) -> Runtime {
    Runtime::builder()
        .host_devices(devices)
        .host_device_memory(device_memory)
        .build()
        .expect("runtime")
}

/// [`runtime_with`], with `max_alloc` bytes as the largest single allocation.
pub fn runtime_with_max_alloc(devices: u32, device_memory: u64, max_alloc: u64) -> Runtime {
    Runtime::builder()
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
    fill(e.ptr, e.size, EXPORTED_SEED);
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

/// Three adjacent 1 MiB reservations holding 7 physical objects of 512 KiB, mostly mapped at
/// non-zero offsets; the range starts 64 KiB into the first object and stops 192 KiB before
/// the end of the third reservation (whose tail stays unmapped: `hole` is its first byte).
/// Returns the exported range plus `hole`.
pub fn make_range(ctx: &Context) -> (Exported, usize) {
    let dev = ctx.driver().device(0).unwrap();
    let m = 1 << 20;
    let rs = adjacent_reservations(ctx, 3, m);
    let objects: Vec<_> = (0..7)
        .map(|_| {
            ctx.create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, 512 << 10)
                .unwrap()
        })
        .collect();
    // (reservation, offset in it, object, offset in object, length), in units of 64 KiB.
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
            rs[r].base + at * K64,
            len * K64,
            objects[o],
            off * K64,
            AccessAttribute::ReadWrite,
        )
        .unwrap();
    }
    let ptr = rs[0].base + K64;
    let hole = rs[2].base + 7 * K64;
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
