//! Level Zero IPC: handles for allocations, physical memory and whole virtual-address ranges,
//! shared between processes. The semantics layer: every IPC rule, its state (the process-wide
//! export and view tables) and its locks; `crate::ipc` (the API) only forwards to it.
//!
//! Spec: oneAPI Level Zero 1.18 core "Memory" IPC calls (`zeMemGetIpcHandle`,
//! `zeMemGetIpcHandleWithProperties`, `zeMemOpenIpcHandle`, `zeMemCloseIpcHandle`,
//! `zeMemPutIpcHandle`) and the memory extensions `ze_ipc_mem_handle_type_ext_desc_t`
//! (`ZE_extension_ipc_mem_handle_type`) and `ze_ipc_phys_mem_handle_range_ext_desc_t`
//! (`ZE_extension_ipc_phys_mem_handle_range`).
//!
//! Files, each importing only those listed before it:
//!
//! | file | what |
//! |---|---|
//! | [`format`] | the 64-byte handle (its byte table), encode / decode, the broker's answer, pieces |
//! | [`handle_types`] | the handle-type rules (DEFAULT, FABRIC_ACCESSIBLE, types chained at creation) |
//! | [`registry`] | the export and view tables of this process, export ids, tokens, statistics, capacity held |
//! | [`views`] | opened views: mapping one, its range and properties, overlap, the queues' operand table |
//! | [`broker`] | what this process's broker answers, starting it, asking another's (transport errors) |
//! | [`export`] | get: allocation, physical object, range (`ze_ipc_phys_mem_handle_range_ext_desc_t`); memory created with handle types |
//! | [`import`] | open, import of a physical object, close, put, handle from an fd, context teardown; the transports and the checks of what an open receives |
//!
//! An export walks one way down: `crate::ipc` -> [`export`] (rules, locks `usm` -> `vm`,
//! `Backend::export_allocation` / `export_physical`) -> [`registry`] / [`broker`] -> backend.
//!
//! Capacity: memory kept alive by a live export, or by a view opened in this process, still
//! counts against its device's capacity after the memory is destroyed or freed; the capacity
//! comes back when the last export or view of it is put or closed (each holds the memory's
//! charge, `crate::semantics::capacity`).

pub(crate) mod broker;
pub(crate) mod export;
pub(crate) mod format;
pub(crate) mod handle_types;
pub(crate) mod import;
pub(crate) mod registry;
pub(crate) mod views;

pub use crate::backend::ipc::{BrokerAnswer, BrokerStats, TransportError};
pub use crate::spec::{
    IpcHandleKind, IpcHandleTypes, IpcProperties, IPC_MEMORY_FLAG_BIAS_CACHED,
    IPC_MEMORY_FLAG_BIAS_UNCACHED,
};
pub use format::{IpcHandle, DEFAULT_MAX_RANGE_PIECES, IPC_HANDLE_SIZE};
pub use handle_types::{check_handle_types, check_new_handle_types, supported_handle_types};
pub(crate) use import::release_context;
pub use registry::{live_exports, open_views, IpcStats};
pub(crate) use views::{opened_properties, opened_range, view_overlapping, views, Views};
