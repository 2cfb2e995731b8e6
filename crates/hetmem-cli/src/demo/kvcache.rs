//! A growable KV cache over hetmem virtual memory, vAttention-style.
//!
//! One reservation per layer for K and one for V ("buffers"), each `slots x stride` bytes: slot
//! `s` of a buffer is `[s*stride, (s+1)*stride)`, room for the maximum context of one request.
//! Physical memory is mapped one page (one physical object) at a time as a sequence grows, and
//! unmapped pages go back to a per-device free pool, so objects are reused; new ones are created
//! only when the pool is empty. Every token gets a tag at the start of its slot in every buffer,
//! checked before its pages are unmapped.
//!
//! Where the host can reach device memory (the host backend), tags are written and read in
//! place; where it cannot (the cuda backend: GPU memory), they go through a host staging
//! buffer and a copy on an immediate command list of the buffer's device, so every tag is
//! still written by and checked against the device's memory.

use std::time::Instant;

use hetmem::{
    AccessAttribute, AllocDesc, BackendKind, CommandList, Context, Device, Error, PhysicalMemory,
    PhysicalMemoryFlags,
};

use super::workload::mix64;

/// K or V.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kv {
    K,
    V,
}

impl Kv {
    pub fn name(self) -> &'static str {
        match self {
            Kv::K => "K",
            Kv::V => "V",
        }
    }
}

/// The tag of `token` of `request` in `layer`'s K or V cache: a hash, so a page that holds
/// another request's, token's or layer's data (a wrong, stale or lost page) fails the check.
pub fn tag(request: u64, token: u32, layer: u32, kv: Kv) -> u64 {
    let key = (token as u64) << 32 | (layer as u64) << 1 | (kv == Kv::V) as u64;
    mix64(mix64(request ^ 0x6b76_6361_6368_6521) ^ key)
}

/// Writes the tags of `tokens` into `slot` (one slot of one buffer, `tok_bytes` per token; it
/// must hold every token of the range).
pub fn write_tags(
    slot: &mut [u8],
    tok_bytes: usize,
    request: u64,
    layer: u32,
    kv: Kv,
    tokens: std::ops::Range<u32>,
) {
    for t in tokens {
        let at = t as usize * tok_bytes;
        slot[at..at + 8].copy_from_slice(&tag(request, t, layer, kv).to_ne_bytes());
    }
}

/// Checks the tags of the first `tokens` tokens of `slot`; `Err(t)` names the first bad token.
pub fn check_tags(
    slot: &[u8],
    tok_bytes: usize,
    request: u64,
    layer: u32,
    kv: Kv,
    tokens: u32,
) -> Result<(), u32> {
    for t in 0..tokens {
        let at = t as usize * tok_bytes;
        let mut b = [0u8; 8];
        b.copy_from_slice(&slot[at..at + 8]);
        if u64::from_ne_bytes(b) != tag(request, t, layer, kv) {
            return Err(t);
        }
    }
    Ok(())
}

/// The first wrong tag found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadTag {
    pub addr: usize,
    pub request: u64,
    pub layer: u32,
    pub kv: Kv,
    pub token: u32,
}

/// One request's share of the cache: its slot, its length, and the physical objects mapped for
/// each buffer, in page order.
#[derive(Debug)]
pub struct Seq {
    pub request: u64,
    pub slot: usize,
    pub tokens: u32,
    pages: Vec<Vec<PhysicalMemory>>,
}

/// The cache's layout.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub layers: u32,
    pub tok_bytes: usize,
    pub slots: usize,
    pub max_context: u32,
    pub page: usize,
}

/// Whether `e` means "no room": a device's capacity or an OS limit (open files, mappings).
pub fn is_capacity(e: &Error) -> bool {
    matches!(e, Error::OutOfDeviceMemory(_) | Error::OutOfHostMemory(_))
}

/// The cache: buffers, pools, and the counters the report needs.
pub struct KvCache {
    ctx: Context,
    devices: Vec<Device>,
    layout: Layout,
    /// Bytes per slot in every buffer: the maximum context, rounded up to whole pages.
    pub stride: usize,
    /// Bytes reserved per buffer.
    pub buffer_bytes: usize,
    bases: Vec<usize>,
    /// Device index of each buffer (pipeline-style: layers split evenly over the devices).
    buf_dev: Vec<usize>,
    pools: Vec<Vec<PhysicalMemory>>,
    /// Physical objects created per device (never destroyed before [`KvCache::destroy`]).
    pub created: Vec<usize>,
    /// Bytes mapped now.
    pub mapped_bytes: usize,
    /// Nanoseconds of every `ctx.map` / `ctx.unmap` call (one page each).
    pub map_ns: Vec<u64>,
    pub unmap_ns: Vec<u64>,
    /// Nanoseconds spent writing tags in [`KvCache::extend`] (queueing their copies, where
    /// staged) and checking them in [`KvCache::verify`] (copies waited for, where staged).
    pub tag_write_ns: u64,
    pub tag_check_ns: std::cell::Cell<u64>,
    /// For device memory the host cannot reach: the staging ring ([`Staging`]).
    staging: Option<std::cell::RefCell<Staging>>,
}

/// Bytes of the host staging ring (at least one slot).
const STAGING_BYTES: usize = 64 << 20;

/// Host USM memory that tags travel through to and from device memory the host cannot reach,
/// used as a ring: copies are queued on one immediate command list per device without
/// waiting, and the ring waits for them all only when it is full (or the host must read).
struct Staging {
    lists: Vec<CommandList>,
    buf: usize,
    len: usize,
    used: usize,
}

impl Staging {
    /// Waits for every queued copy; the ring starts over.
    fn sync(&mut self) -> Result<(), Error> {
        for l in &self.lists {
            l.host_synchronize(u64::MAX)?;
        }
        self.used = 0;
        Ok(())
    }

    /// Whether `n` more bytes fit before the ring must start over.
    fn fits(&self, n: usize) -> bool {
        self.used + n <= self.len
    }

    /// `n` bytes of the ring (waiting for the queued copies first if it is full).
    fn take(&mut self, n: usize) -> Result<usize, Error> {
        if !self.fits(n) {
            self.sync()?;
        }
        let at = self.buf + self.used;
        self.used += n;
        Ok(at)
    }
}

/// Rounds `v` up to a multiple of `to`, or None on overflow.
fn round_up(v: usize, to: usize) -> Option<usize> {
    v.checked_add(to - 1).map(|x| x / to * to)
}

impl KvCache {
    /// Reserves the buffers. `devices` get the layers in equal contiguous shares. Tags go
    /// through a staging ring on the cuda backend (see the module docs), in place elsewhere.
    pub fn new(ctx: Context, devices: Vec<Device>, layout: Layout) -> Result<KvCache, String> {
        let staged = ctx.driver().backend_kind() == BackendKind::Cuda;
        KvCache::new_with(ctx, devices, layout, staged)
    }

    /// [`KvCache::new`], with tags staged through host memory if `staged`.
    fn new_with(
        ctx: Context,
        devices: Vec<Device>,
        layout: Layout,
        staged: bool,
    ) -> Result<KvCache, String> {
        let overflow = || "the cache's size overflows the address space".to_string();
        let stride = (layout.max_context as usize)
            .checked_mul(layout.tok_bytes)
            .and_then(|b| round_up(b, layout.page))
            .ok_or_else(overflow)?;
        let mut buffer_bytes = stride.checked_mul(layout.slots).ok_or_else(overflow)?;
        // A reservation's size must be a multiple of the page size the query gives for it (on
        // every device of the driver); rounding up can change that answer, so repeat.
        loop {
            let mut q = layout.page;
            for d in ctx.driver().devices() {
                q = q.max(
                    ctx.query_page_size(&d, buffer_bytes)
                        .map_err(|e| e.to_string())?,
                );
            }
            let r = round_up(buffer_bytes, q).ok_or_else(overflow)?;
            if r == buffer_bytes {
                break;
            }
            buffer_bytes = r;
        }
        let n = devices.len();
        let nbufs = layout.layers as usize * 2;
        let mut cache = KvCache {
            ctx,
            layout,
            stride,
            buffer_bytes,
            bases: Vec::with_capacity(nbufs),
            buf_dev: (0..nbufs)
                .map(|b| (b / 2) * n / layout.layers as usize)
                .collect(),
            pools: vec![Vec::new(); n],
            created: vec![0; n],
            devices,
            mapped_bytes: 0,
            map_ns: Vec::new(),
            unmap_ns: Vec::new(),
            tag_write_ns: 0,
            tag_check_ns: std::cell::Cell::new(0),
            staging: None,
        };
        if staged {
            let lists = cache
                .devices
                .iter()
                .map(|d| cache.ctx.create_immediate_command_list(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("making the staging command lists: {e}"))?;
            let len = STAGING_BYTES.max(stride);
            let buf = cache
                .ctx
                .alloc_host(&AllocDesc::new(len).relaxed_max_size(true))
                .map_err(|e| format!("allocating the staging buffer: {e}"))?;
            cache.staging = Some(std::cell::RefCell::new(Staging {
                lists,
                buf,
                len,
                used: 0,
            }));
        }
        for b in 0..nbufs {
            match cache.ctx.reserve(None, buffer_bytes) {
                Ok(r) => cache.bases.push(r.base),
                Err(e) => {
                    let _ = cache.destroy();
                    return Err(format!(
                        "reserving buffer {b} of {nbufs} ({buffer_bytes} bytes): {e}"
                    ));
                }
            }
        }
        Ok(cache)
    }

    /// The layer range each device holds.
    pub fn device_layers(&self) -> Vec<(u32, u32, u32)> {
        (0..self.devices.len())
            .filter_map(|d| {
                let ls: Vec<u32> = (0..self.layout.layers)
                    .filter(|&l| self.buf_dev[2 * l as usize] == d)
                    .collect();
                Some((self.devices[d].ordinal(), *ls.first()?, *ls.last()?))
            })
            .collect()
    }

    /// The page size: the unit of mapping, one physical object each.
    pub fn page(&self) -> usize {
        self.layout.page
    }

    /// Number of buffers (K and V of every layer).
    pub fn buffers(&self) -> usize {
        self.bases.len()
    }

    fn nbufs(&self) -> usize {
        self.bases.len()
    }

    fn buf_kv(b: usize) -> (u32, Kv) {
        ((b / 2) as u32, [Kv::K, Kv::V][b & 1])
    }

    fn slot_base(&self, b: usize, slot: usize) -> usize {
        self.bases[b] + slot * self.stride
    }

    /// An empty sequence of `request` in `slot`.
    pub fn seq(&self, request: u64, slot: usize) -> Seq {
        Seq {
            request,
            slot,
            tokens: 0,
            pages: vec![Vec::new(); self.nbufs()],
        }
    }

    /// Pages needed per buffer for `tokens` tokens.
    pub fn pages_for(&self, tokens: u32) -> usize {
        (tokens as usize * self.layout.tok_bytes).div_ceil(self.layout.page)
    }

    /// Whether `tokens` more tokens' pages (from empty) fit in the pools plus the devices' free
    /// capacity. OS limits (open files, mappings) are not foreseen here; they show as errors.
    pub fn room_for(&self, tokens: u32) -> bool {
        let pages = self.pages_for(tokens) as u64;
        let page = self.layout.page as u64;
        (0..self.devices.len()).all(|d| {
            let bufs = self.buf_dev.iter().filter(|&&x| x == d).count() as u64;
            let dev = &self.devices[d];
            let free = dev.info().capacity.saturating_sub(dev.used_memory()) / page;
            pages * bufs <= self.pools[d].len() as u64 + free
        })
    }

    /// A physical object on device `d`: from the pool, else a new one.
    fn acquire(&mut self, d: usize) -> Result<PhysicalMemory, Error> {
        if let Some(p) = self.pools[d].pop() {
            return Ok(p);
        }
        let p = self.ctx.create_physical_memory(
            Some(&self.devices[d]),
            PhysicalMemoryFlags::AllocateOnDevice,
            self.layout.page,
        )?;
        self.created[d] += 1;
        Ok(p)
    }

    /// Grows `seq` to `tokens` tokens: maps the pages they need in every buffer, then writes
    /// their tags. On error the pages mapped so far stay with `seq` and its length is unchanged.
    pub fn extend(&mut self, seq: &mut Seq, tokens: u32) -> Result<(), Error> {
        debug_assert!(tokens <= self.layout.max_context);
        let need = self.pages_for(tokens);
        let page = self.layout.page;
        for b in 0..self.nbufs() {
            while seq.pages[b].len() < need {
                let d = self.buf_dev[b];
                let phys = self.acquire(d)?;
                let addr = self.slot_base(b, seq.slot) + seq.pages[b].len() * page;
                let t = Instant::now();
                let r = self
                    .ctx
                    .map(addr, page, phys, 0, AccessAttribute::ReadWrite);
                self.map_ns.push(t.elapsed().as_nanos() as u64);
                if let Err(e) = r {
                    self.pools[d].push(phys);
                    return Err(e);
                }
                self.mapped_bytes += page;
                seq.pages[b].push(phys);
            }
        }
        let t = Instant::now();
        let r = self.write_new_tags(seq, tokens);
        self.tag_write_ns += t.elapsed().as_nanos() as u64;
        r?;
        seq.tokens = tokens;
        Ok(())
    }

    /// Writes the tags of tokens `seq.tokens..tokens` in every buffer (their pages are mapped).
    fn write_new_tags(&self, seq: &Seq, tokens: u32) -> Result<(), Error> {
        if tokens <= seq.tokens {
            // Nothing new (a trace row of 0 prompt tokens is admitted with none).
            return Ok(());
        }
        let tb = self.layout.tok_bytes;
        for b in 0..self.nbufs() {
            let (layer, kv) = Self::buf_kv(b);
            let base = self.slot_base(b, seq.slot);
            if let Some(st) = &self.staging {
                let mut st = st.borrow_mut();
                let (from, to) = (seq.tokens as usize * tb, tokens as usize * tb);
                let at = st.take(to - from)?;
                // SAFETY: `[at, at + to - from)` is a part of the host USM ring that no queued
                // copy uses (`take` waited for them when it started over).
                let host = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, to - from) };
                for t in seq.tokens..tokens {
                    let o = t as usize * tb - from;
                    host[o..o + 8].copy_from_slice(&tag(seq.request, t, layer, kv).to_ne_bytes());
                }
                st.lists[self.buf_dev[b]].append_memory_copy(
                    base + from,
                    at,
                    to - from,
                    None,
                    &[],
                )?;
                continue;
            }
            // SAFETY: the first `need` pages of this slot are mapped read-write (above) and only
            // this sequence uses them; the slice covers `tokens` tokens, inside those pages.
            let slot =
                unsafe { std::slice::from_raw_parts_mut(base as *mut u8, tokens as usize * tb) };
            write_tags(slot, tb, seq.request, layer, kv, seq.tokens..tokens);
        }
        Ok(())
    }

    /// Checks every tag of `seq` in every buffer. Ok: the number of tags checked.
    pub fn verify(&self, seq: &Seq) -> Result<u64, BadTag> {
        let t = Instant::now();
        let r = self.check_all_tags(seq);
        self.tag_check_ns
            .set(self.tag_check_ns.get() + t.elapsed().as_nanos() as u64);
        r
    }

    fn check_all_tags(&self, seq: &Seq) -> Result<u64, BadTag> {
        if seq.tokens == 0 {
            // No tokens, no tags (a request of 0 prompt and 0 output tokens).
            return Ok(0);
        }
        let tb = self.layout.tok_bytes;
        let n = seq.tokens as usize * tb;
        let bad = |b: usize, token: u32| {
            let (layer, kv) = Self::buf_kv(b);
            BadTag {
                addr: self.slot_base(b, seq.slot) + token as usize * tb,
                request: seq.request,
                layer,
                kv,
                token,
            }
        };
        if let Some(st) = &self.staging {
            // Copy the slots into the ring, and check them whenever the ring is full and at
            // the end. A device that cannot be read reports its first token as bad.
            let mut st = st.borrow_mut();
            let mut queued: Vec<(usize, usize)> = Vec::new();
            let check = |st: &mut Staging, queued: &mut Vec<(usize, usize)>| {
                st.sync()
                    .map_err(|_| bad(queued.first().map_or(0, |q| q.0), 0))?;
                for (b, at) in queued.drain(..) {
                    let (layer, kv) = Self::buf_kv(b);
                    // SAFETY: host USM memory of the ring, written by the finished copy.
                    let slot = unsafe { std::slice::from_raw_parts(at as *const u8, n) };
                    check_tags(slot, tb, seq.request, layer, kv, seq.tokens)
                        .map_err(|t| bad(b, t))?;
                }
                Ok(())
            };
            // Copies queued by `extend` on the same lists run first (each list is in order).
            for b in 0..self.nbufs() {
                if !st.fits(n) {
                    check(&mut st, &mut queued)?;
                }
                let at = st.take(n).map_err(|_| bad(b, 0))?;
                st.lists[self.buf_dev[b]]
                    .append_memory_copy(at, self.slot_base(b, seq.slot), n, None, &[])
                    .map_err(|_| bad(b, 0))?;
                queued.push((b, at));
            }
            check(&mut st, &mut queued)?;
            return Ok(seq.tokens as u64 * self.nbufs() as u64);
        }
        for b in 0..self.nbufs() {
            let (layer, kv) = Self::buf_kv(b);
            let base = self.slot_base(b, seq.slot);
            // SAFETY: `seq.tokens` tokens of this slot lie in pages mapped for `seq` (extend).
            let slot = unsafe { std::slice::from_raw_parts(base as *const u8, n) };
            check_tags(slot, tb, seq.request, layer, kv, seq.tokens).map_err(|t| bad(b, t))?;
        }
        Ok(seq.tokens as u64 * self.nbufs() as u64)
    }

    /// Unmaps every page of `seq` (one call per page) and returns the objects to their pools.
    pub fn release(&mut self, seq: &mut Seq) -> Result<(), String> {
        let page = self.layout.page;
        for b in 0..self.nbufs() {
            let d = self.buf_dev[b];
            for (i, phys) in std::mem::take(&mut seq.pages[b]).into_iter().enumerate() {
                let addr = self.slot_base(b, seq.slot) + i * page;
                let t = Instant::now();
                let r = self.ctx.unmap(addr, page);
                self.unmap_ns.push(t.elapsed().as_nanos() as u64);
                r.map_err(|e| format!("unmapping {addr:#x}: {e}"))?;
                self.mapped_bytes -= page;
                self.pools[d].push(phys);
            }
        }
        seq.tokens = 0;
        Ok(())
    }

    /// Frees the buffers and destroys every pooled object. Call after every sequence is
    /// released.
    pub fn destroy(&mut self) -> Result<(), String> {
        if let Some(st) = self.staging.take() {
            let mut st = st.into_inner();
            st.sync()
                .map_err(|e| format!("waiting for the staging copies: {e}"))?;
            let buf = st.buf;
            drop(st);
            self.ctx
                .free_memory(buf)
                .map_err(|e| format!("freeing the staging buffer: {e}"))?;
        }
        let size = self.buffer_bytes;
        for base in self.bases.drain(..) {
            self.ctx
                .free(base, size)
                .map_err(|e| format!("freeing buffer at {base:#x}: {e}"))?;
        }
        for pool in &mut self.pools {
            for p in pool.drain(..) {
                self.ctx
                    .destroy_physical_memory(p)
                    .map_err(|e| format!("destroying physical object {}: {e}", p.id))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verification_finds_the_first_corrupted_tag() {
        let tb = 2048;
        let mut buf = vec![0u8; 100 * tb];
        write_tags(&mut buf, tb, 9, 3, Kv::V, 0..100);
        assert_eq!(check_tags(&buf, tb, 9, 3, Kv::V, 100), Ok(()));
        buf[57 * tb + 2] ^= 1;
        buf[80 * tb] ^= 1;
        assert_eq!(check_tags(&buf, tb, 9, 3, Kv::V, 100), Err(57));
        // A bad tag past the checked length is not looked at.
        assert_eq!(check_tags(&buf, tb, 9, 3, Kv::V, 57), Ok(()));
    }

    #[test]
    fn verification_rejects_another_requests_layers_or_caches_tags() {
        let tb = 8;
        let mut buf = vec![0u8; 10 * tb];
        write_tags(&mut buf, tb, 1, 0, Kv::K, 0..10);
        assert_eq!(check_tags(&buf, tb, 2, 0, Kv::K, 10), Err(0));
        assert_eq!(check_tags(&buf, tb, 1, 1, Kv::K, 10), Err(0));
        assert_eq!(check_tags(&buf, tb, 1, 0, Kv::V, 10), Err(0));
        // Zeroed memory (a fresh or lost page) never passes.
        assert_eq!(check_tags(&[0u8; 80], tb, 1, 0, Kv::K, 10), Err(0));
    }

    #[test]
    fn cache_maps_grows_verifies_and_reuses_pooled_objects() {
        for staged in [false, true] {
            cache_round_trip(staged);
        }
    }

    /// In place, or through the staging ring and device copies as on the cuda backend (whose
    /// memory the host cannot reach; the host backend's can be corrupted from here to check
    /// that staged verification reads the device's bytes).
    fn cache_round_trip(staged: bool) {
        let rt = hetmem::Runtime::builder()
            .host_devices(2)
            .host_device_memory(64 << 20)
            .build()
            .unwrap();
        let ctx = rt.driver().create_context().unwrap();
        let devs = rt.driver().devices();
        let page = ctx.query_page_size(&devs[0], 1).unwrap();
        let layout = Layout {
            layers: 2,
            tok_bytes: 2048,
            slots: 2,
            max_context: 256,
            page,
        };
        let mut c = KvCache::new_with(ctx, devs, layout, staged).unwrap();
        let mut s = c.seq(5, 1);
        c.extend(&mut s, 40).unwrap();
        c.extend(&mut s, 41).unwrap();
        assert_eq!(c.verify(&s), Ok(41 * 4));
        let per_buf = c.pages_for(41);
        assert_eq!(c.mapped_bytes, 4 * per_buf * page);
        // A stray write into the sequence's mapped memory is caught with its address.
        let victim = c.slot_base(3, 1) + 7 * 2048;
        unsafe { (victim as *mut u64).write(0) };
        let bad = c.verify(&s).unwrap_err();
        assert_eq!(
            (bad.addr, bad.layer, bad.kv, bad.token),
            (victim, 1, Kv::V, 7)
        );
        c.release(&mut s).unwrap();
        assert_eq!(c.mapped_bytes, 0);
        let created: usize = c.created.iter().sum();
        // A second sequence of the same length reuses the pooled objects: nothing new.
        let mut s2 = c.seq(6, 0);
        c.extend(&mut s2, 41).unwrap();
        assert_eq!(c.created.iter().sum::<usize>(), created);
        assert_eq!(c.verify(&s2), Ok(41 * 4));
        c.release(&mut s2).unwrap();
        c.destroy().unwrap();
        let st = rt.driver().vm_stats();
        assert_eq!(
            (st.reservations, st.physical_objects, st.mapped_runs),
            (0, 0, 0)
        );
    }
}
