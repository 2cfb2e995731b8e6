//! The `managed` scene: ACL managed memory with a working set four times one device's capacity.
//!
//! A 256 MiB array of `u32` lives in managed memory; one host-backend device has 64 MiB. The
//! array is processed in 16 MiB chunks on the device: each chunk is prefetched on the stream,
//! then device work (`x -> 3x + lut[x % 256]`) runs on it, with a small read-mostly lookup table
//! that every chunk reads. As the device fills, its least recently used pages are evicted back to
//! the host; at the end the host reads the whole array back (each page still on the device
//! faults once and migrates) and checks every element. The scene prints the counters and the
//! range-attribute answers at each stage, and fails (non-zero exit) if any check is off.

use hetmem::{Advice, Context, Location, RangeAttribute as A, Runtime, MANAGED_PAGE_SIZE as PAGE};

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

pub fn run() -> Result<(), String> {
    println!(
        "managed memory: a {} working set on a device of {} (host backend, userfaultfd), in {} chunks",
        human(ARRAY as u64),
        human(DEVICE),
        human(CHUNK as u64)
    );
    let (rt, dev, ctx) = crate::common::one_device(DEVICE)?;
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
