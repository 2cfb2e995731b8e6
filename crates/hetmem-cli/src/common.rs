//! Pieces every command of the CLI shares.

use hetmem::{Context, Device, Runtime};

/// A library error as the CLI reports it (the spec code's name and the message).
pub fn e2s(e: hetmem::Error) -> String {
    e.to_string()
}

/// The runtime of `hetmem info` and `hetmem demo`: the configuration of the environment
/// (`HETMEM_BACKEND`, `HETMEM_HOST_*`), with the backend `--backend` names if given. Each
/// value the runtime adjusted ([`hetmem::HostConfig::adjustments`]) is a warning on stderr.
pub fn runtime_from_env(backend: Option<&str>) -> Result<Runtime, String> {
    let mut b = hetmem::RuntimeBuilder::from_env().map_err(e2s)?;
    if let Some(k) = backend {
        b = b.backend(hetmem::BackendKind::parse(k).map_err(e2s)?);
    }
    let rt = b.build().map_err(e2s)?;
    // Values the runtime did not take as given (e.g. a largest allocation above the device).
    if let Some(c) = rt.driver().host_config() {
        for a in &c.adjustments {
            eprintln!("hetmem: warning: {a}");
        }
    }
    Ok(rt)
}

/// The fixed set-up of a benchmark or a scene: a host-backend runtime with one device of
/// `bytes` bytes, that device, and a context.
pub fn one_device(bytes: u64) -> Result<(Runtime, Device, Context), String> {
    one_device_pages(bytes, true)
}

/// [`one_device`], with 2 MiB pages where the machine offers them (`huge`) or 4 KiB pages only
/// (`RuntimeBuilder::host_huge_pages`).
pub fn one_device_pages(bytes: u64, huge: bool) -> Result<(Runtime, Device, Context), String> {
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(bytes)
        .host_huge_pages(huge)
        .build()
        .map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    Ok((rt, dev, ctx))
}

/// The runtime of a demo scene or a benchmark that follows the chosen backend: the backend `--backend` names, else `HETMEM_BACKEND`'s, else
/// the host; on the host backend one device of `host_bytes` bytes (the scene's model), on
/// another the runtime of the environment. Returns the runtime, device 0 and a context.
pub fn scene_runtime(
    backend: Option<&str>,
    host_bytes: u64,
) -> Result<(Runtime, Device, Context), String> {
    let kind = match backend
        .map(str::to_string)
        .or_else(|| std::env::var("HETMEM_BACKEND").ok())
    {
        Some(k) => hetmem::BackendKind::parse(&k).map_err(e2s)?,
        None => hetmem::BackendKind::Host,
    };
    if kind == hetmem::BackendKind::Host {
        return one_device(host_bytes);
    }
    let rt = runtime_from_env(backend)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    Ok((rt, dev, ctx))
}

/// Reads and writes device memory as the device sees it: in place where the host reaches it
/// (the host backend), else with copies on an immediate command list of `dev` through a host
/// USM buffer of 64 MiB (the cuda backend).
pub struct DeviceBytes<'a> {
    ctx: &'a Context,
    staged: Option<(hetmem::CommandList, usize)>,
}

const STAGE: usize = 64 << 20;

impl<'a> DeviceBytes<'a> {
    pub fn new(ctx: &'a Context, dev: &Device) -> Result<DeviceBytes<'a>, String> {
        let staged = if ctx.driver().backend_kind() == hetmem::BackendKind::Host {
            None
        } else {
            let list = ctx.create_immediate_command_list(dev).map_err(e2s)?;
            let buf = ctx
                .alloc_host(&hetmem::AllocDesc::new(STAGE))
                .map_err(e2s)?;
            Some((list, buf))
        };
        Ok(DeviceBytes { ctx, staged })
    }

    /// Writes `data` at `dst` (device memory mapped read-write).
    pub fn write(&self, dst: usize, data: &[u8]) -> Result<(), String> {
        let Some((list, buf)) = &self.staged else {
            // SAFETY: on the host backend device memory is process memory; the caller passes
            // memory mapped read-write.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
            return Ok(());
        };
        for (i, part) in data.chunks(STAGE).enumerate() {
            // SAFETY: host USM memory of STAGE bytes; no copy of it is queued (synchronised
            // below before the next part).
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), *buf as *mut u8, part.len()) };
            list.append_memory_copy(dst + i * STAGE, *buf, part.len(), None, &[])
                .map_err(e2s)?;
            list.host_synchronize(u64::MAX).map_err(e2s)?;
        }
        Ok(())
    }

    /// Writes each `(address, word)` of `at` (device memory mapped read-write), all in one
    /// batch of copies where they are staged (at most 64 MiB / 8 words).
    pub fn write_words(&self, at: &[(usize, u64)]) -> Result<(), String> {
        let Some((list, buf)) = &self.staged else {
            for &(a, v) in at {
                // SAFETY: as in `write`.
                unsafe { (a as *mut u64).write_volatile(v) };
            }
            return Ok(());
        };
        if 8 * at.len() > STAGE {
            return Err(format!("{} words do not fit the staging buffer", at.len()));
        }
        for (i, &(a, v)) in at.iter().enumerate() {
            // SAFETY: host USM memory of STAGE bytes; no copy of it is queued.
            unsafe { ((buf + 8 * i) as *mut u64).write(v) };
            list.append_memory_copy(a, buf + 8 * i, 8, None, &[])
                .map_err(e2s)?;
        }
        list.host_synchronize(u64::MAX).map_err(e2s)?;
        Ok(())
    }

    /// The word at each address of `at` (device memory mapped readable), read in one batch.
    pub fn read_words(&self, at: &[usize]) -> Result<Vec<u64>, String> {
        let Some((list, buf)) = &self.staged else {
            // SAFETY: as in `visit`.
            return Ok(at
                .iter()
                .map(|&a| unsafe { (a as *const u64).read_volatile() })
                .collect());
        };
        if 8 * at.len() > STAGE {
            return Err(format!("{} words do not fit the staging buffer", at.len()));
        }
        for (i, &a) in at.iter().enumerate() {
            list.append_memory_copy(buf + 8 * i, a, 8, None, &[])
                .map_err(e2s)?;
        }
        list.host_synchronize(u64::MAX).map_err(e2s)?;
        // SAFETY: host USM memory written by the finished copies.
        Ok((0..at.len())
            .map(|i| unsafe { ((buf + 8 * i) as *const u64).read() })
            .collect())
    }

    /// Hands the `len` bytes at `src` (device memory mapped readable) to `f`, in order, in
    /// place on the host backend, else a staged piece (at most 64 MiB) at a time.
    pub fn visit(&self, src: usize, len: usize, mut f: impl FnMut(&[u8])) -> Result<(), String> {
        let Some((list, buf)) = &self.staged else {
            // SAFETY: as in `write`, memory mapped readable.
            f(unsafe { std::slice::from_raw_parts(src as *const u8, len) });
            return Ok(());
        };
        let mut at = 0;
        while at < len {
            let n = STAGE.min(len - at);
            list.append_memory_copy(*buf, src + at, n, None, &[])
                .map_err(e2s)?;
            list.host_synchronize(u64::MAX).map_err(e2s)?;
            // SAFETY: host USM memory written by the finished copy.
            f(unsafe { std::slice::from_raw_parts(*buf as *const u8, n) });
            at += n;
        }
        Ok(())
    }
}

impl Drop for DeviceBytes<'_> {
    fn drop(&mut self) {
        if let Some((list, buf)) = self.staged.take() {
            drop(list);
            let _ = self.ctx.free_memory(buf);
        }
    }
}
