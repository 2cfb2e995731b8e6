//! The library's state: the runtime made by `aclInit`, the registry of every handle given to C,
//! and the per-thread current context.
//!
//! The registry files the objects of the modules above it (streams and events of
//! [`crate::stream`]) as [`Object`]s by handle, without naming their types: each module owns its
//! type and looks its handles up with [`Global::object`], so this module imports none of them.
//! Physical memory handles, reservations and mapping records are filed apart, in the VMM
//! registry of [`crate::vmm`] (a slab indexed by the handle, one static lock: [`crate::vmm::Vmm`]),
//! which the VMM calls reach without this module's instance or current context.
//!
//! Handles are numbers, unique for the life of the process (a handle is never reused, not even
//! after `aclFinalize` and a new `aclInit`), looked up in one table per kind: a stale, foreign
//! or random handle is simply not found (`ACL_ERROR_RT_PARAM_INVALID`). The registry lock is
//! held only to look up, insert or remove; hetmem is always called with it released, so a
//! blocking call (a stream synchronize waiting for an event another thread records) never holds
//! up other threads. (The VMM registry's lock is held across hetmem's map and physical free,
//! which never wait for device work: see [`crate::vmm::Vmm`].)

use std::any::Any;
use std::cell::RefCell;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::{Fail, Res, ACL_ERROR_RT_CONTEXT_NULL, ACL_ERROR_UNINITIALIZE};

/// A fast hasher for handle keys (unique integers, not attacker-chosen hash-flooding input):
/// one multiply per word (the Fx hash).
#[derive(Default, Clone, Copy)]
pub struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64)
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
    }
}

/// A map keyed by handles.
pub type HashMap<K, V> = std::collections::HashMap<K, V, BuildHasherDefault<HandleHasher>>;

/// An ACL context (`aclrtContext`): a hetmem context on one device.
#[derive(Debug)]
pub struct Ctx {
    /// The handle given to C.
    pub handle: usize,
    /// Its device.
    pub dev: hetmem::Device,
    /// [`hetmem::Context::acl_granularity`] of its device, asked once when the context is made
    /// (a device's answer never changes): the VMM entry points check sizes against it without
    /// taking the semantics layer's lock for it on every call.
    pub gran: usize,
    /// The hetmem context owning everything made in it.
    pub ctx: hetmem::Context,
    /// Whether this is the default context of its device (made by `aclrtSetDevice`), which
    /// `aclrtDestroyContext` refuses.
    pub default: bool,
    /// The default stream (`stream == NULL`), made on first use (a [`crate::stream::AclStream`]).
    pub default_stream: Mutex<Option<Arc<dyn Object>>>,
    /// Cleared when the context is destroyed (its device reset, `aclrtDestroyContext`,
    /// `aclFinalize`): threads holding it as current see that at once.
    pub alive: AtomicBool,
    /// The library instance it belongs to: reached from the calling thread's current context
    /// without taking the global lock ([`fast_global`]). (The registry holds the context and the
    /// context holds the instance; `aclFinalize`, `aclrtResetDevice` and `aclrtDestroyContext`
    /// take contexts out of the registry, which breaks that cycle.)
    pub global: Arc<Global>,
}

/// A reservation made by `aclrtReserveMemAddress`.
#[derive(Debug)]
pub struct Reserved {
    /// The context it was made in.
    pub ctx: Arc<Ctx>,
    /// The hetmem reservation.
    pub r: hetmem::Reservation,
}

/// An object behind a handle, of a type a module above defines (a stream, an event): the registry files it by handle and tears it down through these
/// methods, never knowing its type.
pub trait Object: Any + Send + Sync + std::fmt::Debug {
    /// The context it was made in.
    fn ctx(&self) -> &Arc<Ctx>;
    /// First step of a teardown: waits for its work (a stream synchronizes). Runs for every
    /// object torn down before any [`Object::release`].
    fn quiesce(&self) {}
    /// Second step of a teardown: ends what it shares beyond itself.
    fn release(&self) {}
}

/// `o` as a `T`, if it is one.
pub fn downcast<T: Object>(o: Arc<dyn Object>) -> Option<Arc<T>> {
    let any: Arc<dyn Any + Send + Sync> = o;
    any.downcast::<T>().ok()
}

/// Every handle the library has given out, by kind.
#[derive(Debug, Default)]
pub struct Registry {
    /// Contexts by handle.
    pub contexts: HashMap<usize, Arc<Ctx>>,
    /// Default context handle and `aclrtSetDevice` count, by device.
    pub defaults: HashMap<u32, (usize, u64)>,
    /// Streams and events by handle (each handle's kind is in its low bits, [`fresh_handle`]);
    /// looked up by type with [`Registry::get`]. (Physical memory handles, reservations and
    /// mapping records are in the VMM registry, [`crate::vmm::VMM`].)
    pub objects: HashMap<usize, Arc<dyn Object>>,
}

impl Registry {
    /// The object `h` if it is a `T`.
    pub fn get<T: Object>(&self, h: usize) -> Option<Arc<T>> {
        self.objects.get(&h).cloned().and_then(downcast::<T>)
    }

    /// Takes the object `h` out if it is a `T` (an object of another type stays).
    pub fn remove<T: Object>(&mut self, h: usize) -> Option<Arc<T>> {
        let o = self.objects.get(&h)?;
        let is_t = (o.as_ref() as &dyn Any).is::<T>();
        if !is_t {
            return None;
        }
        self.objects.remove(&h).and_then(downcast::<T>)
    }

    /// Every object that is a `T`.
    pub fn all<T: Object>(&self) -> impl Iterator<Item = Arc<T>> + '_ {
        self.objects.values().cloned().filter_map(downcast::<T>)
    }
}

/// What `aclInit` starts.
#[derive(Debug)]
pub struct Global {
    /// The runtime (backend and driver) chosen by the environment.
    pub rt: hetmem::Runtime,
    /// The registry.
    pub reg: Mutex<Registry>,
}

static GLOBAL: Mutex<Option<Arc<Global>>> = Mutex::new(None);
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

/// A fresh handle value: never 0, never reused, 16-aligned (so it looks like a pointer to C
/// code that prints it), tagged with `kind` (1 context, 2 stream, 3 event, 4 physical memory)
/// in its low bits: a handle of one kind is never found among another kind.
pub fn fresh_handle(kind: usize) -> usize {
    (0x6a00_0000 + NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)) << 4 | kind
}

/// The running library, or `ACL_ERROR_UNINITIALIZE`.
pub fn global() -> Res<Arc<Global>> {
    GLOBAL.lock().clone().ok_or_else(|| {
        Fail::new(
            ACL_ERROR_UNINITIALIZE,
            "the library is not initialised: call aclInit first",
        )
    })
}

/// The running library as an entry point reaches it: through the calling thread's live current
/// context when it has one (two atomic operations, no lock), else through the global slot.
/// Dereferences to [`Global`].
pub enum G {
    /// Reached through the current context (which [`G::current`] then answers).
    Ctx(Arc<Ctx>),
    /// Reached through the global slot.
    Global(Arc<Global>),
}

impl std::ops::Deref for G {
    type Target = Global;
    fn deref(&self) -> &Global {
        match self {
            G::Ctx(c) => &c.global,
            G::Global(g) => g,
        }
    }
}

impl G {
    /// The calling thread's current context (see [`Global::current`]), borrowed: an entry
    /// point counts no reference for it (the one [`fast_global`] took keeps it alive for the
    /// call); it clones the `Arc` only where it files the context with a new object.
    pub fn current(&self) -> Res<&Arc<Ctx>> {
        match self {
            G::Ctx(c) => Ok(c),
            // `fast_global` found no live current context on this thread, and only this thread
            // sets it (a destroyed context never comes back to life): `Global::current` gives
            // the error, naming why.
            G::Global(g) => Err(g.current().err().unwrap_or_else(|| {
                Fail::new(
                    ACL_ERROR_RT_CONTEXT_NULL,
                    "the calling thread has no current context",
                )
            })),
        }
    }
    /// The instance itself.
    pub fn arc(&self) -> Arc<Global> {
        match self {
            G::Ctx(c) => c.global.clone(),
            G::Global(g) => g.clone(),
        }
    }
}

/// The running library (see [`G`]), or `ACL_ERROR_UNINITIALIZE`.
pub fn fast_global() -> Res<G> {
    let c = CURRENT.with(|c| c.borrow().1.upgrade());
    match c {
        Some(c) if c.alive.load(Ordering::Acquire) => Ok(G::Ctx(c)),
        _ => Ok(G::Global(global()?)),
    }
}

/// Installs `g` (aclInit), running `opened` in the same hold of the global slot (so that an
/// `aclFinalize` on another thread comes wholly before or after both); false if one is
/// running.
pub fn install(g: Global, opened: impl FnOnce()) -> bool {
    let mut s = GLOBAL.lock();
    if s.is_some() {
        return false;
    }
    *s = Some(Arc::new(g));
    opened();
    true
}

/// Takes the running library out (aclFinalize) with what `closed` takes out of it, in the same
/// hold of the global slot.
pub fn take<T>(closed: impl FnOnce(&Global) -> T) -> Option<(Arc<Global>, T)> {
    let mut s = GLOBAL.lock();
    let g = s.take()?;
    let t = closed(&g);
    Some((g, t))
}

thread_local! {
    /// The calling thread's current context: its handle (0: none) and a weak reference (which
    /// keeps nothing alive: a destroyed context's memory goes at once).
    static CURRENT: RefCell<(usize, Weak<Ctx>)> = const { RefCell::new((0, Weak::new())) };
}

/// Sets the calling thread's current context (`None` clears it).
pub fn set_current(c: Option<&Arc<Ctx>>) {
    CURRENT.with(|cur| {
        *cur.borrow_mut() = match c {
            Some(c) => (c.handle, Arc::downgrade(c)),
            None => (0, Weak::new()),
        }
    });
}

/// The calling thread's current context handle (0: none).
pub fn current_handle() -> usize {
    CURRENT.with(|c| c.borrow().0)
}

impl Global {
    /// The device with ACL id `id`.
    ///
    /// Errors: `InvalidArgument` (107000) naming the id and the device count.
    pub fn device(&self, id: i64) -> Res<hetmem::Device> {
        self.device_ref(id).cloned()
    }

    /// The device with ACL id `id`, borrowed from the driver (see [`Global::device`]).
    pub fn device_ref(&self, id: i64) -> Res<&hetmem::Device> {
        let driver = self.rt.driver();
        u32::try_from(id)
            .ok()
            .and_then(|i| driver.device_ref(i))
            .ok_or_else(|| {
                // Counted only here: the success path (every VMM call) clones nothing.
                let n = driver.device_list().len();
                hetmem::Error::InvalidArgument(format!(
                    "device id {id} is not a device (this runtime has {n}: 0..={})",
                    n as i64 - 1
                ))
                .into()
            })
    }

    /// The calling thread's current context.
    ///
    /// Errors: `ACL_ERROR_RT_CONTEXT_NULL` (107002) if there is none or it was destroyed (its
    /// device reset).
    pub fn current(&self) -> Res<Arc<Ctx>> {
        let (h, c) = CURRENT.with(|c| {
            let c = c.borrow();
            (c.0, c.1.upgrade())
        });
        c.filter(|c| c.alive.load(Ordering::Acquire))
            .ok_or_else(|| {
                Fail::new(
                    ACL_ERROR_RT_CONTEXT_NULL,
                    if h == 0 {
                        "the calling thread has no current context: call aclrtSetDevice, \
                     aclrtCreateContext or aclrtSetCurrentContext first"
                            .to_string()
                    } else {
                        format!(
                        "the calling thread's current context {h:#x} was destroyed (its device \
                         reset or the context destroyed)"
                    )
                    },
                )
            })
    }

    /// The context `h`.
    ///
    /// Errors: `InvalidArgument` (107000) for a handle that is not a live context.
    pub fn context(&self, h: usize) -> Res<Arc<Ctx>> {
        self.reg
            .lock()
            .contexts
            .get(&h)
            .cloned()
            .ok_or_else(|| bad_handle("context", h))
    }

    /// The object `h`, a `T` (`kind` names it in the error).
    ///
    /// Errors: `InvalidArgument` (107000) for a handle that is not a live `kind`.
    pub fn object<T: Object>(&self, h: usize, kind: &str) -> Res<Arc<T>> {
        self.reg
            .lock()
            .get::<T>(h)
            .ok_or_else(|| bad_handle(kind, h))
    }
}

/// An unknown, destroyed or foreign handle: `InvalidArgument` (107000).
pub fn bad_handle(kind: &str, h: usize) -> Fail {
    if h == 0 {
        return crate::null(kind);
    }
    hetmem::Error::InvalidArgument(format!(
        "{kind} {h:#x} is not a live {kind} of this library (unknown, destroyed or another kind \
         of handle)"
    ))
    .into()
}
