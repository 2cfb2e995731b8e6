//! The `ipc` scene: weight sharing between a trainer and a server process.
//!
//! The trainer (this process) lays out a small transformer's weights as tensors in one virtual
//! range, one physical object per tensor, back to back, and fills them. It publishes them twice:
//! as **one range handle** for the whole range, and as **one handle per tensor**. The server (this
//! binary re-executed with `HETMEM_DEMO_IPC_ROLE=server`) receives the 64-byte handles and the
//! tensor table through a pipe, opens them (through the trainer's broker), checksums every
//! tensor, and reports the time of each way; the trainer checks the server's checksums against
//! its own. Any mismatch exits non-zero.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Instant;

use hetmem::{AccessAttribute, IpcHandle, IpcProperties, PhysicalMemoryFlags};

use crate::common::DeviceBytes;

use crate::info::human;

const ROLE: &str = "HETMEM_DEMO_IPC_ROLE";
const LAYERS: usize = 24;

use crate::common::e2s;

/// The tensors, largest first so that every map is aligned to its page size: per layer the
/// attention (4 MiB) and MLP (8 MiB) weights, then the layer norms (64 KiB each).
fn tensors() -> Vec<(String, usize)> {
    let mut t = Vec::new();
    for l in 0..LAYERS {
        t.push((format!("layer{l}.mlp"), 8 << 20));
        t.push((format!("layer{l}.attn"), 4 << 20));
    }
    for l in 0..LAYERS {
        t.push((format!("layer{l}.norm"), 64 << 10));
    }
    t
}

/// FNV-1a over the 64-bit words of a tensor's bytes (as the device sees them: read in place on
/// the host backend, copied out on the cuda backend).
fn checksum(io: &DeviceBytes, ptr: usize, size: usize) -> Result<u64, String> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    // Pieces are whole multiples of 8 bytes (tensors and the staging buffer are).
    io.visit(ptr, size, |bytes| {
        for w in bytes.chunks_exact(8) {
            let w = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            h = (h ^ w).wrapping_mul(0x0000_0100_0000_01b3);
        }
    })?;
    Ok(h)
}

/// The scene on the backend `--backend` (or `HETMEM_BACKEND`) names; tensors take whole pages
/// of that backend (2 MiB on a GPU, so the 64 KiB norms get a page each there).
pub fn run(backend: Option<&str>) -> Result<(), String> {
    if std::env::var(ROLE).as_deref() == Ok("server") {
        return server();
    }
    let (rt, dev, ctx) = crate::common::scene_runtime(backend, 1 << 30)?;
    let io = DeviceBytes::new(&ctx, &dev)?;
    let base_page = ctx.query_page_size(&dev, 1).map_err(e2s)?;
    let ts: Vec<(String, usize)> = tensors()
        .into_iter()
        .map(|(n, s)| (n, s.next_multiple_of(base_page)))
        .collect();
    let total: usize = ts.iter().map(|t| t.1).sum();
    let page = ctx.query_page_size(&dev, total).map_err(e2s)?;
    let r = ctx
        .reserve(None, total.next_multiple_of(page))
        .map_err(e2s)?;
    let mut objs = Vec::new();
    let mut table = Vec::new();
    let mut at = 0;
    for (i, (_, size)) in ts.iter().enumerate() {
        let o = ctx
            .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, *size)
            .map_err(e2s)?;
        ctx.map(r.base + at, *size, o, 0, AccessAttribute::ReadWrite)
            .map_err(e2s)?;
        let data: Vec<u8> = (0..*size)
            .step_by(8)
            .flat_map(|off| ((i as u64) << 40 ^ off as u64 ^ 0x5eed).to_ne_bytes())
            .collect();
        io.write(r.base + at, &data)?;
        table.push((at, *size, checksum(&io, r.base + at, *size)?));
        objs.push(o);
        at += size;
    }
    println!(
        "trainer (pid {}): {} tensors, {} in one virtual range of {} physical objects",
        std::process::id(),
        ts.len(),
        human(total as u64),
        objs.len()
    );
    let props = IpcProperties {
        range_size: Some(total),
        ..Default::default()
    };
    let t = Instant::now();
    let range = ctx
        .get_ipc_handle_with_properties(r.base, &props)
        .map_err(e2s)?;
    let export_range = t.elapsed();
    let t = Instant::now();
    let per: Vec<IpcHandle> = objs
        .iter()
        .map(|&o| ctx.get_physical_memory_ipc_handle(o, None))
        .collect::<Result<_, _>>()
        .map_err(e2s)?;
    let export_per = t.elapsed();
    println!(
        "published: 1 range handle (64 bytes, exported in {:.3} ms) and {} per-tensor handles \
         ({} bytes, exported in {:.3} ms)",
        export_range.as_secs_f64() * 1e3,
        per.len(),
        64 * per.len(),
        export_per.as_secs_f64() * 1e3
    );
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(["demo", "--scene", "ipc"])
        .env(ROLE, "server")
        .env("HETMEM_BACKEND", rt.driver().backend_kind().name())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the server process: {e}"))?;
    let mut msg = format!("{}\n", table.len()).into_bytes();
    for (off, size, _) in &table {
        msg.extend_from_slice(format!("{off} {size}\n").as_bytes());
    }
    msg.extend_from_slice(range.as_bytes());
    for h in &per {
        msg.extend_from_slice(h.as_bytes());
    }
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    stdin.write_all(&msg).map_err(|e| e.to_string())?;
    drop(stdin);
    let out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
    let mut sums = Vec::new();
    for l in out.lines() {
        let l = l.map_err(|e| e.to_string())?;
        if let Some(rest) = l.strip_prefix("sums ") {
            sums = rest
                .split(' ')
                .map(|s| u64::from_str_radix(s, 16).unwrap_or(0))
                .collect();
        } else {
            println!("{l}");
        }
    }
    let st = child.wait().map_err(|e| e.to_string())?;
    if !st.success() {
        return Err(format!("the server process failed: {st}"));
    }
    let mine: Vec<u64> = table.iter().map(|t| t.2).collect();
    if sums != mine {
        return Err("the server's checksums differ from the trainer's".into());
    }
    println!(
        "trainer: all {} checksums match the trainer's own",
        mine.len()
    );
    ctx.put_ipc_handle(&range).map_err(e2s)?;
    for h in &per {
        ctx.put_ipc_handle(h).map_err(e2s)?;
    }
    ctx.free_reservation(r).map_err(e2s)?;
    for o in objs {
        ctx.destroy_physical_memory(o).map_err(e2s)?;
    }
    Ok(())
}

fn server() -> Result<(), String> {
    let (_rt, dev, ctx) = crate::common::scene_runtime(None, 64 << 20)?;
    let io = DeviceBytes::new(&ctx, &dev)?;
    let mut input = BufReader::new(std::io::stdin().lock());
    let mut l = String::new();
    input.read_line(&mut l).map_err(|e| e.to_string())?;
    let n: usize = l.trim().parse().map_err(|_| "bad tensor count")?;
    let mut table = Vec::with_capacity(n);
    for _ in 0..n {
        l.clear();
        input.read_line(&mut l).map_err(|e| e.to_string())?;
        let mut f = l
            .split_whitespace()
            .map(|x| x.parse::<usize>().unwrap_or(0));
        table.push((f.next().unwrap_or(0), f.next().unwrap_or(0)));
    }
    let mut read = || -> Result<IpcHandle, String> {
        let mut b = [0u8; 64];
        input.read_exact(&mut b).map_err(|e| e.to_string())?;
        Ok(IpcHandle::from_bytes(b))
    };
    let range = read()?;
    let per: Vec<IpcHandle> = (0..n).map(|_| read()).collect::<Result<_, _>>()?;

    // Warm-up (first-open costs of the process: broker connection, page tables).
    let w = ctx.open_ipc_handle(&per[n - 1], 0).map_err(e2s)?;
    ctx.close_ipc_handle(w).map_err(e2s)?;
    // One range handle.
    let t = Instant::now();
    let base = ctx.open_ipc_handle(&range, 0).map_err(e2s)?;
    let open_range = t.elapsed();
    let (b, size) = ctx.get_address_range(base).map_err(e2s)?;
    let sums: Vec<u64> = table
        .iter()
        .map(|&(off, len)| checksum(&io, base + off, len))
        .collect::<Result<_, _>>()?;
    ctx.close_ipc_handle(base).map_err(e2s)?;
    let range_total = t.elapsed();
    // Per-tensor handles.
    let t = Instant::now();
    let views: Vec<usize> = per
        .iter()
        .map(|h| ctx.open_ipc_handle(h, 0))
        .collect::<Result<_, _>>()
        .map_err(e2s)?;
    let open_per = t.elapsed();
    let sums2: Vec<u64> = views
        .iter()
        .zip(&table)
        .map(|(&v, &(_, len))| checksum(&io, v, len))
        .collect::<Result<_, _>>()?;
    for v in views {
        ctx.close_ipc_handle(v).map_err(e2s)?;
    }
    let per_total = t.elapsed();
    if sums != sums2 {
        return Err("range and per-tensor views disagree".into());
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    println!(
        "server (pid {}): opened the range handle: {} at {b:#x} (get_address_range: base {b:#x}, \
         size {size:#x}), no size sent",
        std::process::id(),
        human(size as u64)
    );
    println!(
        "server: range handle:      open {:>8.3} ms, open + checksum {} tensors + close {:>8.3} ms",
        ms(open_range),
        n,
        ms(range_total)
    );
    println!(
        "server: {n} tensor handles: open {:>8.3} ms, open + checksum {} tensors + close {:>8.3} ms",
        ms(open_per),
        n,
        ms(per_total)
    );
    println!(
        "server: one range handle against {n} tensor handles (time ratio, below 1 = the range \
         is faster): open alone {:.2}x ({:.3} vs {:.3} ms); end to end (open + checksum every \
         byte of {n} tensors + close) {:.2}x ({:.3} vs {:.3} ms)",
        ms(open_range) / ms(open_per).max(1e-9),
        ms(open_range),
        ms(open_per),
        ms(range_total) / ms(per_total).max(1e-9),
        ms(range_total),
        ms(per_total)
    );
    let hex: Vec<String> = sums.iter().map(|s| format!("{s:x}")).collect();
    println!("sums {}", hex.join(" "));
    Ok(())
}
