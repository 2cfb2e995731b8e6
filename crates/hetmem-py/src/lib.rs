//! The `hetmem` Python package's extension module, `hetmem._hetmem`: hetmem's public Rust API
//! (`hetmem::{Runtime, Driver, Device, Context}` and the `vmm`, `usm`, `ipc`, `managed`
//! families) as Python classes, the standard zero-copy protocols on its memory
//! ([`memory`]), and the PyTorch allocator's C entry points ([`torch`]).
//!
//! Every error is a Python exception carrying the spec code and hetmem's message
//! ([`errors`]); nothing panics into Python (PyO3 turns a panic into an exception, and the C
//! entry points catch them).

mod api;
mod errors;
mod memory;
mod torch;

use pyo3::prelude::*;

#[pymodule]
fn _hetmem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    api::register(m)?;
    torch::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
