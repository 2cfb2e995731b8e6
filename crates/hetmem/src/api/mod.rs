//! The safe Rust API: [`Runtime`](runtime::Runtime) -> [`Driver`](runtime::Driver) ->
//! [`Device`](runtime::Device)s and [`Context`](runtime::Context)s, as in Level Zero, and one
//! public module per family holding its types and the `impl Context` of its calls. Each call
//! is a thin translation onto the semantics layer (`crate::semantics`), where every rule lives;
//! the C ABI crates (`hetmem-ze`, `hetmem-acl`) sit on this API.

pub mod acl;
mod acl_vmm;
pub mod ipc;
pub mod managed;
pub mod platform;
pub mod queue;
pub mod runtime;
pub mod usm;
pub mod vmm;
