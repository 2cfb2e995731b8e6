//! The `managed` scene: ACL managed memory, processed in chunks on a device with prefetch.
//!
//! **Host backend** ([`run`] picks it when the chosen backend is the host): a working set four
//! times one device's capacity. A 256 MiB array of `u32` lives in managed memory; one
//! host-backend device has 64 MiB. The array is processed in 16 MiB chunks on the device: each
//! chunk is prefetched on the stream, then device work (`x -> 3x + lut[x % 256]`) runs on it,
//! with a small read-mostly lookup table that every chunk reads. As the device fills, its least
//! recently used pages are evicted back to the host; at the end the host reads the whole array
//! back (each page still on the device faults once and migrates) and checks every element. The
//! scene prints the counters and the range-attribute answers at each stage, and fails (non-zero
//! exit) if any check is off.
//!
//! **cuda backend** (a GPU, managed memory from `cuMemAllocManaged`): the same array and lookup
//! table, but never more than a quarter of the GPU's free memory (asking the CUDA driver for
//! more managed memory than the GPU has free can hang it), so nothing is evicted and the
//! eviction part does not apply; the scene says so. There are no kernels on cuda: the device
//! work on each chunk is what a stream offers on managed memory, stream-ordered on device 0 after
//! the chunk's prefetch: a memset of the chunk's first quarter to the chunk's tag, a copy of the
//! lookup table's first 1 KiB after it, and a copy of the previous chunk's first quarter (its
//! tag) over the chunk's last quarter. The host initialises and reads back through the
//! host-synchronous copies (`aclrtMemcpy`), so hetmem's record of where pages are (the counters
//! it keeps on cuda: the CUDA driver reports no faults, evictions or residency) follows them;
//! every element is checked against what the device work must have produced.

use hetmem::{
    Advice, BackendKind, Context, Device, Location, RangeAttribute as A, Runtime,
    MANAGED_PAGE_SIZE as PAGE,
};

use crate::info::human;

const MIB: usize = 1 << 20;
const ARRAY: usize = 256 * MIB;
const CHUNK: usize = 16 * MIB;
const DEVICE: u64 = 64 << 20;

use crate::common::e2s;

fn attrs(ctx: &Context, what: &str, p: usize, s: usize) -> Result<(), String> {
    let a = |x| ctx.managed_attr_i32(x, p, s).map_err(e2s);
    println!(
        "  {what:<34} READ_MOSTLY {}  PREFERRED_LOCATION {}  LAST_PREFETCH_LOCATION {} (type {})  ACCESSED_BY {:?}",
        a(A::ReadMostly)?,
        a(A::PreferredLocation)?,
        a(A::LastPrefetchLocation)?,
        a(A::LastPrefetchLocationType)?,
        ctx.managed_accessed_by(p, s, 2).map_err(e2s)?
    );
    Ok(())
}

fn counters(rt: &Runtime, what: &str) {
    let s = rt.driver().managed_stats();
    let d = &s.devices[0];
    println!(
        "  {what:<34} host faults {:>4}  to device {:>4} pages ({})  to host {:>4} pages ({})  \
         evictions {:>4}  resident: device {} pages, host {} pages",
        s.host_faults,
        d.pages_to_device,
        human(d.bytes_to_device),
        s.pages_to_host,
        human(s.bytes_to_host),
        d.evictions,
        d.resident_pages,
        s.host_resident_pages
    );
}

/// The scene on the backend `--backend` (`backend`), else `HETMEM_BACKEND`, else the host names:
/// on the host backend with one device of 64 MiB ([`run_host`]), on cuda on the machine's GPU 0
/// ([`run_gpu`]).
///
/// Errors: the runtime cannot start (the message says why); any check of the scene failing.
pub fn run(backend: Option<&str>) -> Result<(), String> {
    let (rt, dev, ctx) = crate::common::scene_runtime(backend, DEVICE)?;
    match rt.driver().backend_kind() {
        BackendKind::Host => run_host(rt, dev, ctx),
        BackendKind::Cuda => run_gpu(rt, dev, ctx),
    }
}

/// The host-backend scene: a working set four times the one 64 MiB device of `rt`, evicted and
/// faulted back (userfaultfd).
fn run_host(rt: Runtime, dev: Device, ctx: Context) -> Result<(), String> {
    println!(
        "managed memory: a {} working set on a device of {} (host backend, userfaultfd), in {} chunks",
        human(ARRAY as u64),
        human(DEVICE),
        human(CHUNK as u64)
    );
    let t0 = std::time::Instant::now();
    let data = match ctx.alloc_managed(ARRAY as u64, 1) {
        Ok(p) => p,
        // Managed memory needs userfaultfd; where the OS refuses it the scene cannot run, and
        // says why instead of failing the whole demo.
        Err(e @ hetmem::Error::UnsupportedFeature(_)) => {
            println!("managed memory: skipped: {e}");
            return Ok(());
        }
        Err(e) => return Err(e2s(e)),
    };
    let lut = ctx.alloc_managed(1, 1).map_err(e2s)?; // rounds up to 2 MiB
    attrs(&ctx, "fresh array:", data, ARRAY)?;
    // The host initialises both (first touch populates on the host).
    let n = ARRAY / 4;
    // SAFETY: `data` is a live managed allocation of ARRAY bytes (absent pages fault in).
    let arr = unsafe { std::slice::from_raw_parts_mut(data as *mut u32, n) };
    for (i, x) in arr.iter_mut().enumerate() {
        *x = i as u32;
    }
    // SAFETY: `lut` is a live managed allocation of 2 MiB.
    let table = unsafe { std::slice::from_raw_parts_mut(lut as *mut u32, 256) };
    for (i, x) in table.iter_mut().enumerate() {
        *x = (i * i) as u32;
    }
    ctx.mem_advise(lut, PAGE, Advice::SetReadMostly, Location::Host)
        .map_err(e2s)?;
    ctx.mem_advise(lut, PAGE, Advice::SetAccessedBy, Location::Device(0))
        .map_err(e2s)?;
    counters(&rt, "after host initialisation:");
    attrs(&ctx, "lookup table (advised):", lut, PAGE)?;

    let s = ctx.create_stream(&dev).map_err(e2s)?;
    for c in (0..ARRAY).step_by(CHUNK) {
        ctx.mem_prefetch(data + c, CHUNK, Location::Device(0), 0, &s)
            .map_err(e2s)?;
        s.launch(&[(data + c, CHUNK, true), (lut, 1024, false)], |b| {
            // SAFETY: the runtime made both buffers resident on the device for this work;
            // the chunk is 4-byte aligned and CHUNK long, the table 1 KiB.
            let (chunk, lut) = unsafe {
                (
                    std::slice::from_raw_parts_mut(b[0].ptr as *mut u32, b[0].len / 4),
                    std::slice::from_raw_parts(b[1].ptr as *const u32, 256),
                )
            };
            for x in chunk {
                *x = x.wrapping_mul(3).wrapping_add(lut[(*x % 256) as usize]);
            }
        })
        .map_err(e2s)?;
    }
    s.synchronize().map_err(e2s)?;
    counters(&rt, "after 16 chunks on the device:");
    attrs(&ctx, "last chunk:", data + ARRAY - CHUNK, CHUNK)?;
    // The first chunk goes back to the host by prefetch: the whole array is then mixed.
    ctx.mem_prefetch(data, CHUNK, Location::Host, 0, &s)
        .map_err(e2s)?;
    s.synchronize().map_err(e2s)?;
    attrs(&ctx, "first chunk (prefetched to host):", data, CHUNK)?;
    attrs(&ctx, "whole array (mixed):", data, ARRAY)?;
    let r = ctx
        .managed_residency(lut)
        .ok_or("lookup table not resident")?;
    println!(
        "  lookup table copies: host {} (read-only {}), devices {:?}",
        r.host, r.host_read_only, r.devices
    );
    let st = rt.driver().managed_stats();
    let on_device = st.devices[0].resident_pages;
    if dev.used_memory() > DEVICE || on_device * PAGE as u64 > DEVICE {
        return Err(format!("device over capacity: {} used", dev.used_memory()));
    }
    if st.devices[0].evictions == 0 {
        return Err("no page was evicted although the array is 4x the device".into());
    }

    // The host reads everything back: pages still on the device fault once each.
    let before = st.host_faults;
    let mut bad = 0usize;
    for (i, &x) in arr.iter().enumerate() {
        let i = i as u32;
        let want = i.wrapping_mul(3).wrapping_add((i % 256) * (i % 256));
        bad += (x != want) as usize;
    }
    let after = rt.driver().managed_stats();
    counters(&rt, "after the host read it back:");
    let faults = after.host_faults - before;
    // The lookup table is on the host too (read-only copy): on-device pages of the array only.
    let expect = on_device - r.devices.len() as u64;
    println!(
        "  host read-back: {} elements, {bad} wrong; {faults} host faults for {expect} array pages \
         that were on the device; {:.0} ms in all",
        n,
        t0.elapsed().as_secs_f64() * 1e3
    );
    if bad != 0 || faults != expect {
        return Err(format!(
            "{bad} wrong elements, {faults} faults (expected {expect})"
        ));
    }
    ctx.free_managed(data).map_err(e2s)?;
    ctx.free_managed(lut).map_err(e2s)?;
    println!("  verified: every element correct; device capacity never exceeded; all memory freed");
    Ok(())
}

/// The part of each chunk the device memsets to the chunk's tag (its first quarter), and that
/// the next chunk copies over its own last quarter.
const TAGGED: usize = CHUNK / 4;
/// Bytes of the lookup table each chunk copies in, right after its tagged part.
const LUT_COPY: usize = 1024;

/// Chunk `k`'s tag byte.
fn tag(k: usize) -> u8 {
    0xA0 + k as u8
}

/// Element `j` of the lookup table.
fn lut_value(j: usize) -> u32 {
    (j * j) as u32
}

/// What element `i` of the array holds after the device work of the cuda scene (the array
/// starts as `x[i] = i`; see the module docs).
fn gpu_expected(i: usize) -> u32 {
    let per = CHUNK / 4;
    let (k, j) = (i / per, i % per);
    let (tagged, lut_end) = (TAGGED / 4, (TAGGED + LUT_COPY) / 4);
    if j < tagged {
        u32::from_ne_bytes([tag(k); 4])
    } else if j < lut_end {
        lut_value(j - tagged)
    } else if j >= per - tagged && k > 0 {
        u32::from_ne_bytes([tag(k - 1); 4])
    } else {
        i as u32
    }
}

/// The counters hetmem keeps on cuda: its record of the pages it moved or used (the CUDA driver
/// reports no faults, evictions or residency).
fn gpu_counters(rt: &Runtime, what: &str) -> hetmem::ManagedStats {
    let s = rt.driver().managed_stats();
    let d = &s.devices[0];
    println!(
        "  {what:<34} to device {:>4} pages ({})  to host {:>4} pages ({})  \
         resident: device {} pages, host {} pages",
        d.pages_to_device,
        human(d.bytes_to_device),
        s.pages_to_host,
        human(s.bytes_to_host),
        d.resident_pages,
        s.host_resident_pages
    );
    s
}

/// Refuses (an error naming both sizes) when the scene's array would be more than a quarter of
/// the free memory of GPU `dev`; else the GPU's free and total bytes.
fn gpu_room(dev: &Device) -> Result<(u64, u64), String> {
    let (free, total) = (dev.free_memory().map_err(e2s)?, dev.info().capacity);
    if ARRAY as u64 > free / 4 {
        return Err(format!(
            "managed memory scene: the {} array would be more than a quarter of the {} GPU {} \
             has free; refused, so that managed memory never comes near what the GPU has free \
             (asking for more can hang it)",
            human(ARRAY as u64),
            human(free),
            dev.ordinal()
        ));
    }
    Ok((free, total))
}

/// The host initialises the managed `data` (ARRAY bytes: `x[i] = i`) and `lut` (256 elements),
/// a chunk at a time through `buf` (CHUNK bytes) with `aclrtMemcpy` host to managed.
///
/// Errors: a copy refused (the library's message).
fn gpu_init(ctx: &Context, data: usize, lut: usize, buf: &mut [u8]) -> Result<(), String> {
    for c in (0..ARRAY).step_by(CHUNK) {
        for (j, w) in buf.chunks_exact_mut(4).enumerate() {
            w.copy_from_slice(&((c / 4 + j) as u32).to_ne_bytes());
        }
        ctx.managed_write(data + c, buf).map_err(e2s)?;
    }
    let table: Vec<u8> = (0..256).flat_map(|j| lut_value(j).to_ne_bytes()).collect();
    ctx.managed_write(lut, &table).map_err(e2s)
}

/// Queues the device work of every chunk of `data` on `s` (device 0's stream): the chunk's
/// prefetch to device 0, the memset of its first TAGGED bytes to its tag, the copy of LUT_COPY
/// bytes of `lut` after them, and (from the second chunk on) the copy of the previous chunk's
/// first TAGGED bytes over its last TAGGED bytes. The caller synchronizes `s`.
///
/// Errors: a call refused when queued (the library's message).
fn gpu_device_work(
    ctx: &Context,
    s: &hetmem::Stream,
    data: usize,
    lut: usize,
) -> Result<(), String> {
    for (k, c) in (0..ARRAY).step_by(CHUNK).enumerate() {
        let chunk = data + c;
        ctx.mem_prefetch(chunk, CHUNK, Location::Device(0), 0, s)
            .map_err(e2s)?;
        s.memset_async(chunk, tag(k), TAGGED).map_err(e2s)?;
        s.memcpy_async(chunk + TAGGED, lut, LUT_COPY).map_err(e2s)?;
        if k > 0 {
            s.memcpy_async(chunk + CHUNK - TAGGED, chunk - CHUNK, TAGGED)
                .map_err(e2s)?;
        }
    }
    Ok(())
}

/// The host reads `data` back (`aclrtMemcpy` managed to host, a chunk at a time through `buf`)
/// and checks every element against [`gpu_expected`]: the count of wrong elements and the
/// first one (its index and value).
///
/// Errors: a copy refused (the library's message).
fn gpu_check(
    ctx: &Context,
    data: usize,
    buf: &mut [u8],
) -> Result<(usize, Option<(usize, u32)>), String> {
    let mut bad = 0usize;
    let mut first_bad = None;
    for c in (0..ARRAY).step_by(CHUNK) {
        ctx.managed_read(data + c, buf).map_err(e2s)?;
        for (j, w) in buf.chunks_exact(4).enumerate() {
            let i = c / 4 + j;
            let got = u32::from_ne_bytes(w.try_into().expect("4 bytes"));
            if got != gpu_expected(i) {
                bad += 1;
                first_bad.get_or_insert((i, got));
            }
        }
    }
    Ok((bad, first_bad))
}

/// The cuda scene (see the module docs) on GPU `dev` of `rt`: refuses (an error, nothing
/// allocated) when the array would be more than a quarter of the GPU's free memory.
fn run_gpu(rt: Runtime, dev: Device, ctx: Context) -> Result<(), String> {
    let (free, total) = gpu_room(&dev)?;
    println!(
        "managed memory: a {} array and a {} lookup table on GPU {} ({}, {} free of {}) \
         (cuda backend, cuMemAllocManaged), in {} chunks; the counters are hetmem's record of \
         the pages it moved or used (the CUDA driver reports no faults, evictions or residency)",
        human(ARRAY as u64),
        human(PAGE as u64),
        dev.ordinal(),
        dev.info().name,
        human(free),
        human(total),
        human(CHUNK as u64)
    );
    println!(
        "  eviction: not applicable on a GPU: the host scene's working set is 4x a modelled \
         device so that pages are evicted and faulted back; here managed memory is at most a \
         quarter of what the GPU has free (oversubscribing a GPU can hang it), so nothing is \
         evicted"
    );
    let t0 = std::time::Instant::now();
    let data = ctx.alloc_managed(ARRAY as u64, 1).map_err(e2s)?;
    let lut = match ctx.alloc_managed(1, 1) {
        Ok(p) => p, // rounds up to 2 MiB
        Err(e) => {
            let _ = ctx.free_managed(data);
            return Err(e2s(e));
        }
    };
    let r = gpu_work(&rt, &dev, &ctx, data, lut, t0);
    // Freed whatever happened (a free waits for the stream work queued on it).
    let freed = ctx
        .free_managed(data)
        .and_then(|()| ctx.free_managed(lut))
        .map_err(e2s);
    r?;
    freed?;
    let left = rt.driver().managed_stats();
    if left.allocations != 0 || left.bytes != 0 {
        return Err(format!(
            "{} managed allocations ({} bytes) left after the frees",
            left.allocations, left.bytes
        ));
    }
    println!("  verified: every element correct; the GPU never oversubscribed; all memory freed");
    Ok(())
}

/// The cuda scene's work on the managed `data` (ARRAY bytes) and `lut` (one page), up to the
/// host's check of every element; the caller frees both.
fn gpu_work(
    rt: &Runtime,
    dev: &Device,
    ctx: &Context,
    data: usize,
    lut: usize,
    t0: std::time::Instant,
) -> Result<(), String> {
    let pages = (ARRAY / PAGE) as u64;
    attrs(ctx, "fresh array:", data, ARRAY)?;
    let mut buf = vec![0u8; CHUNK];
    gpu_init(ctx, data, lut, &mut buf)?;
    ctx.mem_advise(lut, PAGE, Advice::SetReadMostly, Location::Host)
        .map_err(e2s)?;
    ctx.mem_advise(lut, PAGE, Advice::SetAccessedBy, Location::Device(0))
        .map_err(e2s)?;
    let st = gpu_counters(rt, "after host initialisation:");
    if st.host_resident_pages != pages + 1 || st.devices[0].resident_pages != 0 {
        return Err(format!(
            "after the host initialisation hetmem's record has {} pages on the host and {} on \
             GPU {} (expected {} and 0)",
            st.host_resident_pages,
            st.devices[0].resident_pages,
            dev.ordinal(),
            pages + 1
        ));
    }
    attrs(ctx, "lookup table (advised):", lut, PAGE)?;

    // Device work, stream-ordered on device 0, chunk by chunk.
    let s = ctx.create_stream(dev).map_err(e2s)?;
    gpu_device_work(ctx, &s, data, lut)?;
    s.synchronize().map_err(e2s)?;
    println!(
        "  device work on each chunk (stream-ordered on GPU {}): prefetch to it, memset of its \
         first {} to the chunk's tag, copy of {} of the lookup table after it, and from the \
         second chunk on a copy of the previous chunk's first {} over its last {}",
        dev.ordinal(),
        human(TAGGED as u64),
        human(LUT_COPY as u64),
        human(TAGGED as u64),
        human(TAGGED as u64)
    );
    let st = gpu_counters(rt, "after 16 chunks on the device:");
    // Every array page and the lookup table were last used on the device.
    if st.devices[0].resident_pages != pages + 1 || st.host_resident_pages != 0 {
        return Err(format!(
            "after the device work hetmem's record has {} pages on GPU {} and {} on the host \
             (expected {} and 0)",
            st.devices[0].resident_pages,
            dev.ordinal(),
            st.host_resident_pages,
            pages + 1
        ));
    }
    attrs(ctx, "last chunk:", data + ARRAY - CHUNK, CHUNK)?;
    // The first chunk goes back to the host by prefetch: the whole array is then mixed.
    ctx.mem_prefetch(data, CHUNK, Location::Host, 0, &s)
        .map_err(e2s)?;
    s.synchronize().map_err(e2s)?;
    drop(s);
    attrs(ctx, "first chunk (prefetched to host):", data, CHUNK)?;
    attrs(ctx, "whole array (mixed):", data, ARRAY)?;
    let st = rt.driver().managed_stats();
    let on_device = st.devices[0].resident_pages;
    let lut_on_device = ctx
        .managed_residency(lut)
        .ok_or("lookup table not resident")?
        .devices
        .len() as u64;

    // The host reads everything back: pages still on the device migrate to the host.
    let before = st.pages_to_host;
    let (bad, first_bad) = gpu_check(ctx, data, &mut buf)?;
    let after = gpu_counters(rt, "after the host read it back:");
    let moved = after.pages_to_host - before;
    let expect = on_device - lut_on_device;
    println!(
        "  host read-back: {} elements, {bad} wrong; {moved} pages moved to the host in hetmem's \
         record for {expect} array pages that were on the device; {:.0} ms in all",
        ARRAY / 4,
        t0.elapsed().as_secs_f64() * 1e3
    );
    if let Some((i, got)) = first_bad {
        return Err(format!(
            "{bad} wrong elements; the first is element {i} (chunk {}): {got:#010x}, expected \
             {:#010x}",
            i / (CHUNK / 4),
            gpu_expected(i)
        ));
    }
    if moved != expect {
        return Err(format!(
            "{moved} pages moved to the host in hetmem's record (expected {expect})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_expected_describes_tags_the_table_the_copied_tag_and_untouched_elements() {
        let per = CHUNK / 4;
        let tagged = TAGGED / 4;
        assert_eq!(gpu_expected(0), 0xA0A0_A0A0);
        assert_eq!(gpu_expected(tagged - 1), 0xA0A0_A0A0);
        assert_eq!(gpu_expected(tagged), 0);
        assert_eq!(gpu_expected(tagged + 255), 255 * 255);
        assert_eq!(gpu_expected(tagged + 256), (tagged + 256) as u32);
        // The first chunk keeps its last quarter; the others take the previous chunk's tag.
        assert_eq!(gpu_expected(per - 1), (per - 1) as u32);
        assert_eq!(gpu_expected(2 * per - 1), 0xA0A0_A0A0);
        assert_eq!(gpu_expected(2 * per - tagged), 0xA0A0_A0A0);
        assert_eq!(
            gpu_expected(2 * per - tagged - 1),
            (2 * per - tagged - 1) as u32
        );
        assert_eq!(gpu_expected(16 * per - 1), 0xAEAE_AEAE);
        assert_eq!(gpu_expected(15 * per), 0xAFAF_AFAF);
    }

    /// The cuda scene's device work and check on the backend `HETMEM_BACKEND` names (the GPU in
    /// a cuda run, a host device of 1 GiB otherwise): every element as [`gpu_expected`] says,
    /// and one element spoilt afterwards is the only one found wrong.
    #[test]
    fn gpu_device_work_gives_what_the_check_expects_and_the_check_finds_a_spoilt_element() {
        let (_rt, dev, ctx) = match crate::common::scene_runtime(None, 1 << 30) {
            Ok(r) => r,
            Err(e) if e.contains("cannot start on this machine") => {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED ({}) gpu_device_work_gives_what_the_check_expects_and_the_check_finds_a_spoilt_element: {e}",
                    std::env::var("HETMEM_BACKEND").unwrap_or_default()
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        if ctx.driver().backend_kind() == BackendKind::Cuda {
            gpu_room(&dev).expect("room on the GPU");
        }
        let data = ctx.alloc_managed(ARRAY as u64, 1).expect("managed array");
        let lut = ctx.alloc_managed(1, 1).expect("managed table");
        let mut buf = vec![0u8; CHUNK];
        gpu_init(&ctx, data, lut, &mut buf).unwrap();
        let s = ctx.create_stream(&dev).unwrap();
        gpu_device_work(&ctx, &s, data, lut).unwrap();
        s.synchronize().unwrap();
        assert_eq!(gpu_check(&ctx, data, &mut buf).unwrap(), (0, None));
        let spoilt = 5 * (CHUNK / 4) + TAGGED / 4 + 7;
        ctx.managed_write(data + 4 * spoilt, &1u32.to_ne_bytes())
            .unwrap();
        assert_eq!(
            gpu_check(&ctx, data, &mut buf).unwrap(),
            (1, Some((spoilt, 1)))
        );
        drop(s);
        ctx.free_managed(data).unwrap();
        ctx.free_managed(lut).unwrap();
    }
}
