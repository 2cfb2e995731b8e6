//! Pieces every command of the CLI shares.

use hetmem::{Context, Device, Runtime};

/// A library error as the CLI reports it (the spec code's name and the message).
pub fn e2s(e: hetmem::Error) -> String {
    e.to_string()
}

/// The runtime of `hetmem info` and `hetmem demo`: the configuration of the environment
/// (`HETMEM_BACKEND`, `HETMEM_HOST_*`), with the backend `--backend` names if given.
pub fn runtime_from_env(backend: Option<&str>) -> Result<Runtime, String> {
    let mut b = hetmem::RuntimeBuilder::from_env().map_err(e2s)?;
    if let Some(k) = backend {
        b = b.backend(hetmem::BackendKind::parse(k).map_err(e2s)?);
    }
    b.build().map_err(e2s)
}

/// The fixed set-up of a benchmark or a scene: a host-backend runtime with one device of
/// `bytes` bytes, that device, and a context.
pub fn one_device(bytes: u64) -> Result<(Runtime, Device, Context), String> {
    let rt = Runtime::builder()
        .host_devices(1)
        .host_device_memory(bytes)
        .build()
        .map_err(e2s)?;
    let dev = rt.driver().device(0).ok_or("no device")?;
    let ctx = rt.driver().create_context().map_err(e2s)?;
    Ok((rt, dev, ctx))
}
