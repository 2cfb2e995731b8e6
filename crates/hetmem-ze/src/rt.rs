//! The driver's state: one runtime ([`hetmem::Runtime::from_env`], made by `zeInit` /
//! `zeInitDrivers`), the handle registry, and the entry guard every exported function runs in.
//!
//! # Handles
//! A handle given to C is an opaque number, never a pointer: `(kind << 48) | serial`, serials
//! counting from 1 and never reused. Every call looks its handles up in the registry (a hash
//! map under a read-write lock) and checks their kind, so a null handle is
//! `ZE_RESULT_ERROR_INVALID_NULL_HANDLE` and an unknown, destroyed or wrong-kind one is the same
//! code (the code the loader's handle-lifetime checker answers), never a crash. Destroying an
//! object removes it and everything made from it (a context's queues, lists, pools, events,
//! fences and physical memory; a pool's events; a queue's fences) from the registry; the Rust
//! objects are dropped after the registry lock is released (a queue's drop waits for its
//! engine).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use hetmem::{
    CommandList, CommandQueue, Context, Device, Event, EventPool, Fence, PhysicalMemory, Runtime,
};
use parking_lot::{Mutex, RwLock};

use crate::types::*;

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Kind {
    Driver = 1,
    Device = 2,
    Context = 3,
    Queue = 4,
    List = 5,
    EventPool = 6,
    Event = 7,
    Fence = 8,
    Physical = 9,
}

/// A queue and how it was created.
pub struct QueueObj {
    pub queue: CommandQueue,
    pub synchronous: bool,
}

/// A command list and how it was created.
pub struct ListObj {
    pub list: CommandList,
    /// Immediate list created with `ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS`: each append waits.
    pub synchronous: bool,
}

/// An event of a pool (its slot is held by the event itself, freed when it is dropped).
pub struct EventObj {
    pub event: Event,
    pub pool: u64,
}

/// The objects behind handles.
#[derive(Clone)]
pub enum Obj {
    Driver,
    Device(Device),
    Context(Context),
    Queue(Arc<QueueObj>),
    List(Arc<ListObj>),
    EventPool(Arc<EventPool>),
    Event(Arc<EventObj>),
    Fence(Arc<Fence>),
    Physical(PhysicalMemory),
}

struct Entry {
    obj: Obj,
    /// The handle this object was made from (its context, pool or queue); 0 for none.
    parent: u64,
}

pub struct State {
    pub runtime: Runtime,
    pub driver: u64,
    pub devices: Vec<u64>,
    /// The handles of each device's sub-devices (`zeDeviceGetSubDevices`), by device ordinal.
    pub sub_devices: Vec<Vec<u64>>,
    /// `zeDriverGetDefaultContext`'s context, made on first use.
    pub default_context: OnceLock<u64>,
}

static STATE: OnceLock<State> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());
/// Handles are distinct small numbers: a multiplicative hash is enough (and much cheaper than
/// SipHash on every call).
#[derive(Default, Clone, Copy)]
pub struct HandleHasher(u64);

impl std::hash::Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (v ^ (v >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Registry = HashMap<u64, Entry, std::hash::BuildHasherDefault<HandleHasher>>;

static REGISTRY: OnceLock<RwLock<Registry>> = OnceLock::new();
static SERIAL: AtomicU64 = AtomicU64::new(1);

fn registry() -> &'static RwLock<Registry> {
    REGISTRY.get_or_init(|| RwLock::new(Registry::default()))
}

/// Result of an entry point's body: `Ok(code)` for a success code (`ZE_RESULT_SUCCESS` or
/// `ZE_RESULT_NOT_READY`), `Err(code)` for an error.
pub type ZeResult = Result<u32, u32>;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error (`zeDriverGetLastErrorDescription`).
pub fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// This thread's last error message, valid until the thread's next failing call.
pub fn last_error_ptr() -> *const std::ffi::c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Translates a hetmem error: its code, and its message as the thread's last error.
pub fn ze(e: hetmem::Error) -> u32 {
    set_last_error(&e.to_string());
    e.ze_result()
}

/// An error code with a message.
pub fn fail(code: u32, msg: impl AsRef<str>) -> u32 {
    set_last_error(msg.as_ref());
    code
}

/// Runs an entry point's body: a panic becomes `ZE_RESULT_ERROR_UNKNOWN` and never crosses the
/// C ABI.
#[inline]
pub fn guard(f: impl FnOnce() -> ZeResult) -> ze_result_t {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(c)) | Ok(Err(c)) => c,
        Err(_) => {
            set_last_error("internal panic in the hetmem Level Zero driver");
            ZE_RESULT_ERROR_UNKNOWN
        }
    }
}

/// Makes the runtime (once; a failure is not remembered, the next init tries again).
pub fn init() -> ZeResult {
    if STATE.get().is_some() {
        return Ok(ZE_RESULT_SUCCESS);
    }
    let _g = INIT_LOCK.lock();
    if STATE.get().is_some() {
        return Ok(ZE_RESULT_SUCCESS);
    }
    let runtime = Runtime::from_env().map_err(|e| {
        let msg = format!("hetmem Level Zero driver: {e}");
        eprintln!("{msg}");
        fail(e.ze_result(), msg)
    })?;
    let driver = insert(Kind::Driver, Obj::Driver, 0);
    let roots = runtime.driver().devices();
    let sub_devices = roots
        .iter()
        .map(|d| {
            d.sub_devices()
                .into_iter()
                .map(|s| insert(Kind::Device, Obj::Device(s), 0))
                .collect()
        })
        .collect();
    let devices = roots
        .into_iter()
        .map(|d| insert(Kind::Device, Obj::Device(d), 0))
        .collect();
    let _ = STATE.set(State {
        runtime,
        driver,
        devices,
        sub_devices,
        default_context: OnceLock::new(),
    });
    Ok(ZE_RESULT_SUCCESS)
}

/// The state, or `ZE_RESULT_ERROR_UNINITIALIZED` before `zeInit`.
pub fn state() -> Result<&'static State, u32> {
    STATE.get().ok_or_else(|| {
        fail(
            ZE_RESULT_ERROR_UNINITIALIZED,
            "zeInit / zeInitDrivers has not succeeded",
        )
    })
}

/// Registers `obj` and returns its new handle.
pub fn insert(kind: Kind, obj: Obj, parent: u64) -> u64 {
    let h = ((kind as u64) << 48) | SERIAL.fetch_add(1, Ordering::Relaxed);
    registry().write().insert(h, Entry { obj, parent });
    h
}

/// Looks a handle up: null -> `INVALID_NULL_HANDLE`; unknown, destroyed or of another kind ->
/// `INVALID_NULL_HANDLE` naming it.
pub fn get(h: *mut std::ffi::c_void, kind: Kind) -> Result<Obj, u32> {
    let h = h as u64;
    let what = || format!("{kind:?} handle");
    if h == 0 {
        return Err(fail(
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
            format!("{} is null", what()),
        ));
    }
    state()?;
    if h >> 48 != kind as u64 {
        return Err(fail(
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
            format!("{h:#x} is not a {}", what()),
        ));
    }
    match registry().read().get(&h) {
        Some(e) => Ok(e.obj.clone()),
        None => Err(fail(
            ZE_RESULT_ERROR_INVALID_NULL_HANDLE,
            format!("{h:#x} is not a live {} (destroyed, or never made)", what()),
        )),
    }
}

/// Removes `h` and everything made from it; the objects are dropped after the lock is
/// released. Returns whether `h` was live.
/// The live events of event pool `pool`.
pub fn events_of_pool(pool: u64) -> Vec<Arc<EventObj>> {
    registry()
        .read()
        .values()
        .filter_map(|e| match &e.obj {
            Obj::Event(ev) if ev.pool == pool => Some(ev.clone()),
            _ => None,
        })
        .collect()
}

pub fn remove_tree(h: u64) -> bool {
    let mut dropped = Vec::new();
    {
        let mut reg = registry().write();
        let Some(e) = reg.remove(&h) else {
            return false;
        };
        dropped.push(e);
        let mut frontier = vec![h];
        while let Some(p) = frontier.pop() {
            let kids: Vec<u64> = reg
                .iter()
                .filter(|(_, e)| e.parent == p)
                .map(|(&k, _)| k)
                .collect();
            for k in kids {
                if let Some(e) = reg.remove(&k) {
                    dropped.push(e);
                    frontier.push(k);
                }
            }
        }
    }
    // Children first (queues before their context), outside the lock.
    while let Some(e) = dropped.pop() {
        drop(e);
    }
    true
}

/// Live handles of each kind (leak checks, `hetmemZeLiveHandles`).
pub fn live_handles() -> usize {
    registry().read().len()
}

/// The handle of device `ordinal`, or of its sub-device `sub`.
pub fn device_handle(ordinal: u32, sub: Option<u32>) -> u64 {
    STATE
        .get()
        .and_then(|s| match sub {
            None => s.devices.get(ordinal as usize).copied(),
            Some(k) => s
                .sub_devices
                .get(ordinal as usize)
                .and_then(|v| v.get(k as usize))
                .copied(),
        })
        .unwrap_or(0)
}

/// The handle of `d` (a device or sub-device of this driver's runtime).
pub fn handle_of(d: &Device) -> u64 {
    device_handle(d.ordinal(), d.sub_device_id())
}

macro_rules! getter {
    ($name:ident, $kind:ident, $ty:ty) => {
        /// Looks up a handle of this kind (see [`get`]).
        pub fn $name(h: *mut std::ffi::c_void) -> Result<$ty, u32> {
            match get(h, Kind::$kind)? {
                Obj::$kind(x) => Ok(x),
                _ => Err(ZE_RESULT_ERROR_INVALID_NULL_HANDLE),
            }
        }
    };
}
getter!(device, Device, Device);
getter!(context, Context, Context);
getter!(queue, Queue, Arc<QueueObj>);
getter!(list, List, Arc<ListObj>);
getter!(pool, EventPool, Arc<EventPool>);
getter!(event, Event, Arc<EventObj>);
getter!(fence, Fence, Arc<Fence>);
getter!(physical, Physical, PhysicalMemory);

/// Checks a driver handle.
pub fn driver(h: *mut std::ffi::c_void) -> Result<&'static State, u32> {
    get(h, Kind::Driver)?;
    state()
}
