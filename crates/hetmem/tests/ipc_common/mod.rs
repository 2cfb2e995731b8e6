//! Shared by the IPC tests: the memory layouts they export and the byte patterns they check.
#![allow(dead_code)]

use hetmem::{AccessAttribute, AllocDesc, Context, PhysicalMemoryFlags, Reservation, Runtime};

pub const K64: usize = 64 << 10;

pub fn runtime() -> Runtime {
    Runtime::builder()
        .host_devices(1)
        .host_device_memory(256 << 20)
        .build()
        .expect("runtime")
}

/// Word `i` (every 8 bytes) of a view holds `seed ^ offset`.
pub fn fill(ptr: usize, size: usize, seed: u64) {
    for off in (0..size).step_by(8) {
        // SAFETY: [ptr, ptr+size) is mapped read-write by the caller.
        unsafe { ((ptr + off) as *mut u64).write_volatile(seed ^ off as u64) };
    }
}

/// First offset where the pattern of `seed` is not found, if any.
pub fn check(ptr: usize, size: usize, seed: u64) -> Option<usize> {
    (0..size)
        .step_by(8)
        // SAFETY: [ptr, ptr+size) is mapped readable by the caller.
        .find(|&off| unsafe { ((ptr + off) as *const u64).read_volatile() } != seed ^ off as u64)
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
