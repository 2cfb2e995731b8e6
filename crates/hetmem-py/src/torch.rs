//! What `hetmem.torch` runs on: a device-memory allocator over hetmem's virtual memory, with
//! the two C entry points `torch.cuda.memory.CUDAPluggableAllocator` loads from this library
//! (`hetmem_torch_malloc`, `hetmem_torch_free`), sleep / wake by tag at the same virtual
//! addresses, the span of a tag for sharing through one IPC range handle, and the growable
//! buffer under `hetmem.torch.GrowableTensor`. Nothing here needs torch: the pytest suite runs
//! it on the host backend (calling the C entry points through ctypes), and on a GPU the same
//! code runs on the cuda backend.
//!
//! # The allocator
//! Each tag (the one `hetmem.torch.region(tag)` sets; `"default"` outside any region) has, per
//! device, an **arena**: one virtual reservation (`HETMEM_TORCH_ARENA` bytes, default 256 GiB)
//! carved first-fit into blocks, so a tag's memory is one contiguous span that one IPC range
//! handle shares. A block is `size` rounded up to the page size (2 MiB), one physical object
//! (created exportable, `ze_ipc_mem_handle_type_ext_desc_t` DEFAULT) mapped whole, READWRITE:
//! one `cuMemCreate` + `cuMemMap` + `cuMemSetAccess` on a GPU. A freed block is unmapped and
//! its physical object destroyed (the device memory goes back), its addresses back to the
//! arena. Under `torch.cuda.MemPool` PyTorch's caching allocator sits on top and asks for whole
//! segments; as the process-wide allocator every tensor is a block.
//!
//! # Sleep and wake
//! [`torch_sleep`] releases the physical memory of every block of the tags (unmap + destroy),
//! keeping the addresses reserved; with `offload` the bytes are first copied to pinned host
//! memory (a host USM allocation per block, kept across wakes unless asked otherwise), all the
//! copies queued on one immediate command list per device and waited for once. [`torch_wake`]
//! creates and maps new physical objects at the same addresses and copies the bytes back:
//! pointers (tensors' `data_ptr()`, CUDA graphs' captured addresses) never change.
//!
//! # Errors
//! The C entry points never unwind: a failure (or a panic) returns NULL from malloc (PyTorch
//! then raises its out-of-memory error) and is kept for `hetmem.torch.last_error()`.

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::sync::Arc;

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::api::{Context, IpcHandle};
use crate::errors::IntoPyResult;
use crate::memory::{Memory, Place, Region, RegionKind};

const DEFAULT_ARENA: usize = 256 << 30;
const DEFAULT_TAG: &str = "default";

#[derive(Debug)]
struct Block {
    size: usize,
    dev: u32,
    tag: Arc<str>,
    phys: Option<hetmem::PhysicalMemory>,
    /// Pinned host copy (a host USM allocation of `size` bytes).
    backup: Option<usize>,
    /// The bytes in `backup` are the block's (an offloading sleep wrote them).
    backed_up: bool,
}

#[derive(Debug)]
struct Arena {
    base: usize,
    size: usize,
    top: usize,
    /// Free ranges below `top`: start -> length.
    holes: BTreeMap<usize, usize>,
}

impl Arena {
    fn take(&mut self, size: usize) -> Option<usize> {
        if let Some((&s, &l)) = self.holes.iter().find(|(_, &l)| l >= size) {
            self.holes.remove(&s);
            if l > size {
                self.holes.insert(s + size, l - size);
            }
            return Some(s);
        }
        if self.top + size > self.base + self.size {
            return None;
        }
        let p = self.top;
        self.top += size;
        Some(p)
    }

    fn give(&mut self, ptr: usize, size: usize) {
        let mut start = ptr;
        let mut len = size;
        if let Some((&s, &l)) = self.holes.range(..ptr).next_back() {
            if s + l == ptr {
                self.holes.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(&l) = self.holes.get(&(ptr + size)) {
            self.holes.remove(&(ptr + size));
            len += l;
        }
        if start + len == self.top {
            self.top = start;
        } else {
            self.holes.insert(start, len);
        }
    }
}

struct Allocator {
    ctx: hetmem::Context,
    arena_size: usize,
    arenas: HashMap<(Arc<str>, u32), Arena>,
    blocks: BTreeMap<usize, Block>,
    tag: Arc<str>,
    lists: HashMap<u32, hetmem::CommandList>,
    mallocs: u64,
    frees: u64,
    last_error: Option<String>,
}

static ALLOCATOR: Mutex<Option<Allocator>> = parking_lot::const_mutex(None);

fn make_allocator(backend: Option<&str>, arena_size: Option<usize>) -> hetmem::Result<Allocator> {
    let mut b = hetmem::RuntimeBuilder::from_env()?;
    match backend {
        Some(k) => b = b.backend(hetmem::BackendKind::parse(k)?),
        // PyTorch's device memory: the cuda backend unless HETMEM_BACKEND says otherwise.
        None if std::env::var_os("HETMEM_BACKEND").is_none() => {
            b = b.backend(hetmem::BackendKind::Cuda)
        }
        None => {}
    }
    let rt = b.build()?;
    let ctx = rt.driver().create_context()?;
    let arena_size = match arena_size {
        Some(n) => n,
        None => match std::env::var("HETMEM_TORCH_ARENA") {
            Ok(v) => hetmem::parse_bytes(&v).map_err(|e| {
                hetmem::Error::InvalidArgument(format!("HETMEM_TORCH_ARENA={v:?}: {}", e.message()))
            })? as usize,
            Err(_) => DEFAULT_ARENA,
        },
    };
    let arena_size = arena_size.div_ceil(2 << 20) * (2 << 20);
    Ok(Allocator {
        ctx,
        arena_size,
        arenas: HashMap::new(),
        blocks: BTreeMap::new(),
        tag: Arc::from(DEFAULT_TAG),
        lists: HashMap::new(),
        mallocs: 0,
        frees: 0,
        last_error: None,
    })
}

fn device(ctx: &hetmem::Context, dev: u32) -> hetmem::Result<hetmem::Device> {
    ctx.driver().device(dev).ok_or_else(|| {
        hetmem::Error::InvalidArgument(format!(
            "device {dev} does not exist ({} devices)",
            ctx.driver().device_list().len()
        ))
    })
}

impl Allocator {
    fn malloc(&mut self, size: usize, dev: u32) -> hetmem::Result<usize> {
        let device = device(&self.ctx, dev)?;
        let page = self.ctx.query_page_size(&device, size.max(2 << 20))?;
        let rounded = size.div_ceil(page) * page;
        let tag = self.tag.clone();
        let key = (tag.clone(), dev);
        if !self.arenas.contains_key(&key) {
            let r = self.ctx.reserve(None, self.arena_size)?;
            self.arenas.insert(
                key.clone(),
                Arena {
                    base: r.base,
                    size: r.size,
                    top: r.base,
                    holes: BTreeMap::new(),
                },
            );
        }
        let arena = self.arenas.get_mut(&key).expect("made above");
        let va = arena.take(rounded).ok_or_else(|| {
            hetmem::Error::OutOfDeviceMemory(format!(
                "the arena of tag {tag:?} on device {dev} ({:#x} bytes of addresses, \
                 HETMEM_TORCH_ARENA) has no room for {rounded:#x} bytes",
                arena.size
            ))
        })?;
        let made = self
            .ctx
            .create_physical_memory_with_ipc_types(
                Some(&device),
                hetmem::PhysicalMemoryFlags::AllocateOnDevice,
                rounded,
                hetmem::IpcHandleTypes::DEFAULT,
            )
            .and_then(|phys| {
                match self
                    .ctx
                    .map(va, rounded, phys, 0, hetmem::AccessAttribute::ReadWrite)
                {
                    Ok(()) => Ok(phys),
                    Err(e) => {
                        let _ = self.ctx.destroy_physical_memory(phys);
                        Err(e)
                    }
                }
            });
        let phys = match made {
            Ok(p) => p,
            Err(e) => {
                self.arenas.get_mut(&key).expect("made").give(va, rounded);
                return Err(e);
            }
        };
        self.blocks.insert(
            va,
            Block {
                size: rounded,
                dev,
                tag,
                phys: Some(phys),
                backup: None,
                backed_up: false,
            },
        );
        self.mallocs += 1;
        Ok(va)
    }

    fn free(&mut self, ptr: usize) -> hetmem::Result<()> {
        let Some(b) = self.blocks.remove(&ptr) else {
            return Err(hetmem::Error::InvalidArgument(format!(
                "{ptr:#x} is not a block of hetmem's torch allocator"
            )));
        };
        let r = self.release_block(ptr, &b);
        if let Some(h) = b.backup {
            let _ = self.ctx.free_memory(h);
        }
        if let Some(a) = self.arenas.get_mut(&(b.tag.clone(), b.dev)) {
            a.give(ptr, b.size);
        }
        self.frees += 1;
        r
    }

    /// Unmaps the block and destroys its physical object (if it has one).
    fn release_block(&self, ptr: usize, b: &Block) -> hetmem::Result<()> {
        if let Some(p) = b.phys {
            self.ctx.unmap(ptr, b.size)?;
            self.ctx.destroy_physical_memory(p)?;
        }
        Ok(())
    }

    fn list(&mut self, dev: u32) -> hetmem::Result<&hetmem::CommandList> {
        if !self.lists.contains_key(&dev) {
            let d = device(&self.ctx, dev)?;
            let l = self.ctx.create_immediate_command_list(&d)?;
            self.lists.insert(dev, l);
        }
        Ok(&self.lists[&dev])
    }

    fn selected(&self, tags: &Option<Vec<String>>, asleep: bool) -> Vec<usize> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.phys.is_none() == asleep)
            .filter(|(_, b)| {
                tags.as_ref()
                    .is_none_or(|t| t.iter().any(|x| **x == *b.tag))
            })
            .map(|(&p, _)| p)
            .collect()
    }

    fn sync_lists(&mut self, devs: &[u32]) -> hetmem::Result<()> {
        for d in devs {
            self.list(*d)?.host_synchronize(u64::MAX)?;
        }
        Ok(())
    }

    fn sleep(
        &mut self,
        tags: &Option<Vec<String>>,
        offload: bool,
    ) -> hetmem::Result<(usize, usize)> {
        let sel = self.selected(tags, false);
        let mut devs: Vec<u32> = Vec::new();
        if offload {
            for &p in &sel {
                let (size, dev, backup) = {
                    let b = &self.blocks[&p];
                    (b.size, b.dev, b.backup)
                };
                let h = match backup {
                    Some(h) => h,
                    None => {
                        let h = self.ctx.alloc_host(&hetmem::AllocDesc::new(size))?;
                        self.blocks.get_mut(&p).expect("selected").backup = Some(h);
                        h
                    }
                };
                self.list(dev)?.append_memory_copy(h, p, size, None, &[])?;
                if !devs.contains(&dev) {
                    devs.push(dev);
                }
            }
            self.sync_lists(&devs)?;
        }
        let mut bytes = 0;
        for &p in &sel {
            let b = self.blocks.get_mut(&p).expect("selected");
            let (size, phys) = (b.size, b.phys.take());
            b.backed_up = offload;
            if let Some(ph) = phys {
                if let Err(e) = self
                    .ctx
                    .unmap(p, size)
                    .and_then(|_| self.ctx.destroy_physical_memory(ph))
                {
                    // Still mapped (the unmap failed) or still alive: keep the record true.
                    if self.ctx.get_access_attribute(p, size).map(|(a, _)| a)
                        != Ok(hetmem::AccessAttribute::None)
                    {
                        self.blocks.get_mut(&p).expect("selected").phys = Some(ph);
                    }
                    return Err(e);
                }
            }
            bytes += size;
        }
        Ok((sel.len(), bytes))
    }

    fn wake(
        &mut self,
        tags: &Option<Vec<String>>,
        keep_host_copy: bool,
    ) -> hetmem::Result<(usize, usize)> {
        let sel = self.selected(tags, true);
        let mut devs: Vec<u32> = Vec::new();
        let mut bytes = 0;
        for &p in &sel {
            let (size, dev) = {
                let b = &self.blocks[&p];
                (b.size, b.dev)
            };
            let device = device(&self.ctx, dev)?;
            let phys = self.ctx.create_physical_memory_with_ipc_types(
                Some(&device),
                hetmem::PhysicalMemoryFlags::AllocateOnDevice,
                size,
                hetmem::IpcHandleTypes::DEFAULT,
            )?;
            if let Err(e) = self
                .ctx
                .map(p, size, phys, 0, hetmem::AccessAttribute::ReadWrite)
            {
                let _ = self.ctx.destroy_physical_memory(phys);
                return Err(e);
            }
            let b = self.blocks.get_mut(&p).expect("selected");
            b.phys = Some(phys);
            if let (Some(h), true) = (b.backup, b.backed_up) {
                self.list(dev)?.append_memory_copy(p, h, size, None, &[])?;
                if !devs.contains(&dev) {
                    devs.push(dev);
                }
            }
            bytes += size;
        }
        self.sync_lists(&devs)?;
        for &p in &sel {
            let b = self.blocks.get_mut(&p).expect("selected");
            b.backed_up = false;
            if !keep_host_copy {
                if let Some(h) = b.backup.take() {
                    self.ctx.free_memory(h)?;
                }
            }
        }
        Ok((sel.len(), bytes))
    }
}

fn with_allocator<R>(f: impl FnOnce(&mut Allocator) -> hetmem::Result<R>) -> hetmem::Result<R> {
    let mut g = ALLOCATOR.lock();
    if g.is_none() {
        *g = Some(make_allocator(None, None)?);
    }
    let a = g.as_mut().expect("set above");
    let r = f(a);
    if let Err(e) = &r {
        a.last_error = Some(e.to_string());
    }
    r
}

/// `void* hetmem_torch_malloc(size_t size, int device, cudaStream_t stream)`: the alloc
/// function `torch.cuda.memory.CUDAPluggableAllocator` calls. A block of at least `size` bytes
/// (rounded up to the page size) on `device`, in the arena of the current tag; NULL on failure
/// (the reason in `hetmem.torch.last_error()`) and for size 0. `stream` is unused: a block's
/// memory is ready when this returns.
#[no_mangle]
pub extern "C" fn hetmem_torch_malloc(
    size: usize,
    device: i32,
    _stream: *mut c_void,
) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let r = std::panic::catch_unwind(|| {
        with_allocator(|a| {
            let dev = u32::try_from(device).map_err(|_| {
                hetmem::Error::InvalidArgument(format!("device {device} is negative"))
            })?;
            a.malloc(size, dev)
        })
    });
    match r {
        Ok(Ok(p)) => p as *mut c_void,
        Ok(Err(_)) => std::ptr::null_mut(),
        Err(_) => {
            if let Some(a) = ALLOCATOR.lock().as_mut() {
                a.last_error = Some("hetmem_torch_malloc panicked".into());
            }
            std::ptr::null_mut()
        }
    }
}

/// `void hetmem_torch_free(void* ptr, size_t size, int device, cudaStream_t stream)`: the free
/// function of the pluggable allocator. Unmaps the block, destroys its physical object and
/// gives its addresses back. A pointer that is not a block is ignored (kept as the last error).
/// The caller makes sure no queued kernel still uses the block (PyTorch's caching allocator
/// synchronizes before it releases segments).
#[no_mangle]
pub extern "C" fn hetmem_torch_free(
    ptr: *mut c_void,
    _size: usize,
    _device: i32,
    _stream: *mut c_void,
) {
    if ptr.is_null() {
        return;
    }
    let _ = std::panic::catch_unwind(|| with_allocator(|a| a.free(ptr as usize)));
}

fn tags_arg(tags: Option<Vec<String>>) -> Option<Vec<String>> {
    tags.filter(|t| !t.is_empty())
}

/// Starts the allocator on `backend` (default: `cuda` unless `HETMEM_BACKEND` says otherwise)
/// with arenas of `arena_size` bytes (default `HETMEM_TORCH_ARENA` or 256 GiB). Called by
/// `hetmem.torch` before PyTorch's first allocation; a second call keeps the running allocator
/// unless `backend` or `arena_size` ask for another one while no block is live.
///
/// Errors: `RuntimeError` to restart with live blocks; the runtime's errors
/// (`UninitializedError` where the backend cannot start).
#[pyfunction]
#[pyo3(signature = (backend = None, arena_size = None))]
fn torch_init(
    py: Python<'_>,
    backend: Option<&str>,
    arena_size: Option<usize>,
) -> PyResult<String> {
    let mut g = ALLOCATOR.lock();
    if let Some(a) = g.as_ref() {
        let same_backend = backend.is_none_or(|k| {
            hetmem::BackendKind::parse(k).ok() == Some(a.ctx.driver().backend_kind())
        });
        if same_backend
            && arena_size.is_none_or(|n| n.div_ceil(2 << 20) * (2 << 20) == a.arena_size)
        {
            return Ok(a.ctx.driver().backend_kind().name().into());
        }
        if !a.blocks.is_empty() {
            return Err(PyRuntimeError::new_err(format!(
                "hetmem's torch allocator has {} live blocks; it cannot restart",
                a.blocks.len()
            )));
        }
    }
    let backend = backend.map(str::to_owned);
    let a = py
        .detach(|| make_allocator(backend.as_deref(), arena_size))
        .py()?;
    let name = a.ctx.driver().backend_kind().name().to_string();
    *g = Some(a);
    Ok(name)
}

/// The allocator's context (its runtime's), for the memory objects of `hetmem.torch`.
#[pyfunction]
fn torch_context(py: Python<'_>) -> PyResult<Context> {
    let ctx = py.detach(|| with_allocator(|a| Ok(a.ctx.clone()))).py()?;
    Ok(Context { inner: ctx })
}

/// Sets the tag new blocks get; returns the previous one.
#[pyfunction]
fn torch_set_tag(tag: &str) -> PyResult<String> {
    if tag.is_empty() {
        return Err(PyValueError::new_err("a tag is a non-empty string"));
    }
    let mut g = ALLOCATOR.lock();
    let a = match g.as_mut() {
        Some(a) => a,
        None => {
            *g = Some(make_allocator(None, None).map_err(crate::errors::to_py)?);
            g.as_mut().expect("set")
        }
    };
    let prev = std::mem::replace(&mut a.tag, Arc::from(tag));
    Ok(prev.to_string())
}

/// `torch_malloc(size, device=0) -> ptr` and `torch_free(ptr)`: the C entry points' work, with
/// the error raised (for tests and for callers without ctypes).
#[pyfunction]
#[pyo3(signature = (size, device = 0))]
fn torch_malloc(py: Python<'_>, size: usize, device: u32) -> PyResult<usize> {
    py.detach(|| with_allocator(|a| a.malloc(size, device)))
        .py()
}

#[pyfunction]
fn torch_free(py: Python<'_>, ptr: usize) -> PyResult<()> {
    py.detach(|| with_allocator(|a| a.free(ptr))).py()
}

/// Puts the blocks of `tags` (all blocks for none) to sleep: their physical memory is
/// released, their addresses stay reserved; `offload` copies the bytes to pinned host memory
/// first. Returns `(blocks, bytes)` put to sleep.
#[pyfunction]
#[pyo3(signature = (tags = None, offload = true))]
fn torch_sleep(
    py: Python<'_>,
    tags: Option<Vec<String>>,
    offload: bool,
) -> PyResult<(usize, usize)> {
    let tags = tags_arg(tags);
    py.detach(|| with_allocator(|a| a.sleep(&tags, offload)))
        .py()
}

/// Wakes the sleeping blocks of `tags` (all for none) at the same addresses, the bytes copied
/// back where they were offloaded; `keep_host_copy=False` frees the pinned copies afterwards
/// (the next offload then allocates them again). Returns `(blocks, bytes)` woken.
#[pyfunction]
#[pyo3(signature = (tags = None, keep_host_copy = true))]
fn torch_wake(
    py: Python<'_>,
    tags: Option<Vec<String>>,
    keep_host_copy: bool,
) -> PyResult<(usize, usize)> {
    let tags = tags_arg(tags);
    py.detach(|| with_allocator(|a| a.wake(&tags, keep_host_copy)))
        .py()
}

/// The live blocks, as `(ptr, size, device, tag, asleep)` tuples in address order.
#[pyfunction]
#[pyo3(signature = (tag = None))]
fn torch_blocks(tag: Option<&str>) -> Vec<(usize, usize, u32, String, bool)> {
    let g = ALLOCATOR.lock();
    let Some(a) = g.as_ref() else {
        return Vec::new();
    };
    a.blocks
        .iter()
        .filter(|(_, b)| tag.is_none_or(|t| *b.tag == *t))
        .map(|(&p, b)| (p, b.size, b.dev, b.tag.to_string(), b.phys.is_none()))
        .collect()
}

/// The block containing `ptr`: `(base, size, device, tag, asleep)`, or None.
#[pyfunction]
fn torch_block_of(ptr: usize) -> Option<(usize, usize, u32, String, bool)> {
    let g = ALLOCATOR.lock();
    let a = g.as_ref()?;
    let (&p, b) = a.blocks.range(..=ptr).next_back()?;
    (ptr < p + b.size).then(|| (p, b.size, b.dev, b.tag.to_string(), b.phys.is_none()))
}

/// `(base, end)` of the blocks of `tag` on `device`: the span a range handle shares.
///
/// Errors: `ValueError` if the tag has no block there.
#[pyfunction]
#[pyo3(signature = (tag, device = 0))]
fn torch_span(tag: &str, device: u32) -> PyResult<(usize, usize)> {
    let g = ALLOCATOR.lock();
    let blocks: Vec<(usize, usize)> = g
        .as_ref()
        .map(|a| {
            a.blocks
                .iter()
                .filter(|(_, b)| *b.tag == *tag && b.dev == device)
                .map(|(&p, b)| (p, b.size))
                .collect()
        })
        .unwrap_or_default();
    match (blocks.first(), blocks.last()) {
        (Some(&(s, _)), Some(&(p, l))) => Ok((s, p + l)),
        _ => Err(PyValueError::new_err(format!(
            "tag {tag:?} has no block on device {device}"
        ))),
    }
}

/// One IPC range handle for the span of `tag` on `device` (every block of it, mapped and
/// awake, with no gap: a gap is `AddressNotFoundError` naming its first byte).
#[pyfunction]
#[pyo3(signature = (tag, device = 0))]
fn torch_share(py: Python<'_>, tag: &str, device: u32) -> PyResult<(IpcHandle, usize, usize)> {
    let (s, e) = torch_span(tag, device)?;
    let props = hetmem::IpcProperties {
        range_size: Some(e - s),
        ..Default::default()
    };
    let h = py
        .detach(|| with_allocator(|a| a.ctx.get_ipc_handle_with_properties(s, &props)))
        .py()?;
    Ok((IpcHandle { inner: h }, s, e - s))
}

/// Counters: `mallocs`, `frees`, `blocks`, `bytes` (live), `asleep_bytes`, `host_copy_bytes`,
/// `backend`, `arena_size`, `tag`.
#[pyfunction]
fn torch_stats<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let g = ALLOCATOR.lock();
    if let Some(a) = g.as_ref() {
        d.set_item("backend", a.ctx.driver().backend_kind().name())?;
        d.set_item("arena_size", a.arena_size)?;
        d.set_item("tag", a.tag.to_string())?;
        d.set_item("mallocs", a.mallocs)?;
        d.set_item("frees", a.frees)?;
        d.set_item("blocks", a.blocks.len())?;
        d.set_item("bytes", a.blocks.values().map(|b| b.size).sum::<usize>())?;
        d.set_item(
            "asleep_bytes",
            a.blocks
                .values()
                .filter(|b| b.phys.is_none())
                .map(|b| b.size)
                .sum::<usize>(),
        )?;
        d.set_item(
            "host_copy_bytes",
            a.blocks
                .values()
                .filter(|b| b.backup.is_some())
                .map(|b| b.size)
                .sum::<usize>(),
        )?;
    }
    Ok(d)
}

/// The last error of the allocator (what made a malloc return NULL), or None.
#[pyfunction]
fn torch_last_error() -> Option<String> {
    ALLOCATOR.lock().as_ref().and_then(|a| a.last_error.clone())
}

/// A buffer whose addresses never change: a reservation of `capacity` bytes (rounded up to
/// `chunk`) of which the first `size` bytes are backed, grown and shrunk in `chunk`s (a
/// multiple of the page size, default 64 MiB: one `cuMemMap` + `cuMemSetAccess` per chunk on a
/// GPU) mapped from a pool of physical objects. Its exports (`__dlpack__`, the array
/// interfaces) span the whole capacity, so a tensor over it keeps one `data_ptr()` for life:
/// only the first `mapped` bytes may be touched.
///
/// With `prefetch` chunks asked for, a thread of its own keeps that many made ahead in the
/// pool (never more than the capacity still needs): growth then only maps, and the
/// `cuMemCreate`s happen beside it. Without (the default) a chunk is made when growth needs
/// one and the pool is empty.
#[pyclass(extends = Memory, frozen, module = "hetmem")]
pub struct Growable {
    region: Arc<Region>,
    sh: Arc<GrowShared>,
    /// Bytes per element of `grow_items` (at least 1).
    itemsize: usize,
    /// The prefetch thread, while there is one.
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The state and the prefetch thread's wake-up.
struct GrowShared {
    st: Mutex<GrowState>,
    cv: parking_lot::Condvar,
}

struct GrowState {
    dev: hetmem::Device,
    chunk: usize,
    size: usize,
    mapped: Vec<hetmem::PhysicalMemory>,
    pool: Vec<hetmem::PhysicalMemory>,
    /// Chunks the prefetch thread keeps in the pool (0: no prefetching).
    ahead: usize,
    /// Chunks the prefetch thread is making now.
    making: usize,
    /// Chunks the capacity holds (the pool never grows past what it still needs).
    cap_chunks: usize,
    /// Set when the buffer goes: the prefetch thread ends.
    stop: bool,
    /// Why prefetching stopped, if a chunk could not be made.
    prefetch_error: Option<String>,
}

fn make_chunk(
    ctx: &hetmem::Context,
    dev: &hetmem::Device,
    chunk: usize,
) -> hetmem::Result<hetmem::PhysicalMemory> {
    ctx.create_physical_memory_with_ipc_types(
        Some(dev),
        hetmem::PhysicalMemoryFlags::AllocateOnDevice,
        chunk,
        hetmem::IpcHandleTypes::DEFAULT,
    )
}

impl GrowState {
    fn take_chunk(&mut self, ctx: &hetmem::Context) -> hetmem::Result<hetmem::PhysicalMemory> {
        match self.pool.pop() {
            Some(p) => Ok(p),
            None => make_chunk(ctx, &self.dev, self.chunk),
        }
    }

    /// Whether the prefetch thread has chunks to make.
    fn wants_prefetch(&self) -> bool {
        let have = self.pool.len() + self.making;
        !self.stop && have < self.ahead && self.mapped.len() + have < self.cap_chunks
    }

    fn resize(
        &mut self,
        ctx: &hetmem::Context,
        base: usize,
        cap: usize,
        n: usize,
    ) -> hetmem::Result<()> {
        if n > cap {
            return Err(hetmem::Error::UnsupportedSize(format!(
                "{n:#x} bytes is past the growable buffer's capacity of {cap:#x}"
            )));
        }
        let want = n.div_ceil(self.chunk);
        while self.mapped.len() < want {
            let p = self.take_chunk(ctx)?;
            let at = base + self.mapped.len() * self.chunk;
            if let Err(e) = ctx.map(at, self.chunk, p, 0, hetmem::AccessAttribute::ReadWrite) {
                self.pool.push(p);
                return Err(e);
            }
            self.mapped.push(p);
        }
        if self.mapped.len() > want {
            let from = base + want * self.chunk;
            ctx.unmap(from, (self.mapped.len() - want) * self.chunk)?;
            let back = self.mapped.split_off(want);
            self.pool.extend(back);
        }
        self.size = n;
        Ok(())
    }
}

/// The prefetch thread: makes chunks (the lock not held) while the pool has fewer than
/// `ahead`, sleeps until growth takes some, ends at `stop`. A chunk it cannot make stops
/// prefetching (`prefetch_error` says why); growth then makes its chunks itself.
fn prefetch_loop(sh: Arc<GrowShared>, ctx: hetmem::Context) {
    let mut g = sh.st.lock();
    loop {
        if g.stop {
            return;
        }
        if !g.wants_prefetch() {
            sh.cv.wait(&mut g);
            continue;
        }
        g.making += 1;
        let (dev, chunk) = (g.dev.clone(), g.chunk);
        let made = parking_lot::MutexGuard::unlocked(&mut g, || make_chunk(&ctx, &dev, chunk));
        g.making -= 1;
        match made {
            Ok(p) if !g.stop => {
                g.pool.push(p);
                sh.cv.notify_all(); // wait_prefetch
            }
            Ok(p) => {
                let _ = ctx.destroy_physical_memory(p);
            }
            Err(e) => {
                g.prefetch_error = Some(e.to_string());
                g.ahead = 0;
            }
        }
    }
}

impl Growable {
    /// The growth fast path: sets the backed size to `n` (already checked against nothing
    /// else) when that needs no chunk mapped or unmapped, with the GIL held and no driver
    /// call; `None` when it does (or the buffer is freed, or `n` is past the capacity: the
    /// slow path reports those).
    fn quick(&self, n: impl FnOnce(usize) -> usize) -> Option<usize> {
        if !self.region.alive.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let mut s = self.sh.st.lock();
        let n = n(s.size);
        if n <= self.region.size && n.div_ceil(s.chunk) == s.mapped.len() {
            s.size = n;
            Some(n)
        } else {
            None
        }
    }

    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut GrowState, &hetmem::Context, usize, usize) -> hetmem::Result<R> + Send,
    ) -> PyResult<R> {
        self.region.check_alive()?;
        let r = &self.region;
        let (ctx, base, cap) = (r.ctx.clone(), r.ptr, r.size);
        let sh = &self.sh;
        py.detach(|| {
            let mut g = sh.st.lock();
            let out = f(&mut g, &ctx, base, cap);
            if g.wants_prefetch() {
                sh.cv.notify_all();
            }
            out
        })
        .py()
    }

    /// Ends the prefetch thread (waiting for a chunk it is making), if there is one.
    fn stop_prefetch(&self) {
        self.sh.st.lock().stop = true;
        self.sh.cv.notify_all();
        if let Some(t) = self.worker.lock().take() {
            let _ = t.join();
        }
    }
}

#[pymethods]
impl Growable {
    /// Backed bytes asked for (at most `capacity`).
    #[getter]
    fn used(&self) -> usize {
        self.sh.st.lock().size
    }
    /// Bytes mapped now (`used` rounded up to the chunk).
    #[getter]
    fn mapped(&self) -> usize {
        let s = self.sh.st.lock();
        s.mapped.len() * s.chunk
    }
    /// Bytes of addresses reserved (the most it can grow to).
    #[getter]
    fn capacity(&self) -> usize {
        self.region.size
    }
    /// Bytes per physical chunk.
    #[getter]
    fn chunk(&self) -> usize {
        self.sh.st.lock().chunk
    }
    /// Chunks in the pool (unmapped, ready to map).
    #[getter]
    fn pool_chunks(&self) -> usize {
        self.sh.st.lock().pool.len()
    }
    /// Chunks the prefetch thread keeps made ahead in the pool (0: none).
    #[getter]
    fn prefetch(&self) -> usize {
        self.sh.st.lock().ahead
    }
    /// Why prefetching stopped (a chunk that could not be made), or `None`.
    #[getter]
    fn prefetch_error(&self) -> Option<String> {
        self.sh.st.lock().prefetch_error.clone()
    }
    /// Blocks until the prefetch thread has made what it keeps ahead (or stopped); returns
    /// the chunks in the pool. Immediate without prefetching.
    fn wait_prefetch(&self, py: Python<'_>) -> usize {
        let sh = &self.sh;
        py.detach(|| {
            let mut g = sh.st.lock();
            while g.wants_prefetch() || g.making > 0 {
                sh.cv.wait_for(&mut g, std::time::Duration::from_millis(1));
            }
            g.pool.len()
        })
    }
    /// Bytes per element of `grow_items` (the `itemsize` it was made with).
    #[getter]
    fn itemsize(&self) -> usize {
        self.itemsize
    }
    /// Sets the backed size to `nbytes`: maps chunks (from the pool first) or unmaps the ones
    /// past it back into the pool. The address never changes.
    ///
    /// Errors: `UnsupportedSizeError` past the capacity; `OutOfDeviceMemoryError` when a chunk
    /// cannot be made (nothing mapped so far is undone).
    fn resize(&self, py: Python<'_>, nbytes: usize) -> PyResult<()> {
        if self.quick(|_| nbytes).is_some() {
            return Ok(());
        }
        self.with(py, |s, c, b, cap| s.resize(c, b, cap, nbytes))
    }
    /// Grows the backed size by `n` elements of `itemsize` bytes (`grow(n * itemsize)`);
    /// returns the new size in elements (`used // itemsize`). One call per growth step
    /// (`hetmem.torch.GrowableTensor.grow` is this method).
    ///
    /// Errors: those of `resize`.
    fn grow_items(&self, py: Python<'_>, n: usize) -> PyResult<usize> {
        let item = self.itemsize;
        let nbytes = n.saturating_mul(item);
        if let Some(b) = self.quick(|size| size.saturating_add(nbytes)) {
            return Ok(b / item);
        }
        self.grow(py, nbytes).map(|b| b / item)
    }
    /// Grows the backed size by `nbytes`; returns the new size.
    fn grow(&self, py: Python<'_>, nbytes: usize) -> PyResult<usize> {
        if let Some(n) = self.quick(|size| size.saturating_add(nbytes)) {
            return Ok(n);
        }
        self.with(py, |s, c, b, cap| {
            let n = s.size.saturating_add(nbytes);
            s.resize(c, b, cap, n)?;
            Ok(n)
        })
    }
    /// Shrinks the backed size by `nbytes` (to 0 at least); returns the new size.
    fn shrink(&self, py: Python<'_>, nbytes: usize) -> PyResult<usize> {
        if let Some(n) = self.quick(|size| size.saturating_sub(nbytes)) {
            return Ok(n);
        }
        self.with(py, |s, c, b, cap| {
            let n = s.size.saturating_sub(nbytes);
            s.resize(c, b, cap, n)?;
            Ok(n)
        })
    }
    /// Makes chunks until the pool holds `nbytes` (rounded up to chunks).
    fn fill_pool(&self, py: Python<'_>, nbytes: usize) -> PyResult<()> {
        self.with(py, |s, c, _, _| {
            while s.pool.len() * s.chunk < nbytes {
                let p = make_chunk(c, &s.dev, s.chunk)?;
                s.pool.push(p);
            }
            Ok(())
        })
    }
    /// Destroys the pooled chunks (their device memory goes back) and stops prefetching.
    fn trim_pool(&self, py: Python<'_>) -> PyResult<()> {
        self.with(py, |s, c, _, _| {
            s.ahead = 0;
            while let Some(p) = s.pool.pop() {
                c.destroy_physical_memory(p)?;
            }
            Ok(())
        })
    }
    /// Frees the reservation and every chunk (the prefetch thread ends first).
    fn free(&self, py: Python<'_>) -> PyResult<()> {
        self.region.retire()?;
        let (ctx, base, cap) = (self.region.ctx.clone(), self.region.ptr, self.region.size);
        py.detach(|| {
            self.stop_prefetch();
            release_growable(&ctx, base, cap, &mut self.sh.st.lock())
        })
        .py()
    }
}

fn release_growable(
    ctx: &hetmem::Context,
    base: usize,
    cap: usize,
    st: &mut GrowState,
) -> hetmem::Result<()> {
    ctx.free(base, cap)?;
    for p in st.mapped.drain(..).chain(st.pool.drain(..)) {
        ctx.destroy_physical_memory(p)?;
    }
    Ok(())
}

impl Drop for Growable {
    fn drop(&mut self) {
        self.stop_prefetch();
        if self
            .region
            .alive
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            let r = &self.region;
            let _ = release_growable(&r.ctx, r.ptr, r.size, &mut self.sh.st.lock());
        }
    }
}

/// A growable buffer of at most `capacity` bytes on `device` in `ctx` (see `Growable`).
/// `itemsize` (bytes, at least 1) is the element size of `Growable.grow_items`; `prefetch`
/// chunks are kept made ahead by a thread of the buffer's own (0: none, chunks made on
/// demand).
///
/// Errors: `UnsupportedSizeError` for a chunk that is not a multiple of the page size or a
/// capacity of 0; `ValueError` for an `itemsize` of 0; the reservation's errors.
#[pyfunction]
#[pyo3(signature = (ctx, capacity, chunk = 64 << 20, device = 0, itemsize = 1, prefetch = 0))]
fn growable(
    py: Python<'_>,
    ctx: &Context,
    capacity: usize,
    chunk: usize,
    device: u32,
    itemsize: usize,
    prefetch: usize,
) -> PyResult<Py<Growable>> {
    if itemsize == 0 {
        return Err(pyo3::exceptions::PyValueError::new_err(
            "itemsize 0: an element has at least one byte",
        ));
    }
    let c = ctx.inner.clone();
    let dev = device_of(&c, device).py()?;
    let page = c.query_page_size(&dev, chunk.max(1)).py()?;
    if chunk == 0 || !chunk.is_multiple_of(page) {
        return Err(crate::errors::to_py(hetmem::Error::UnsupportedSize(
            format!("chunk {chunk:#x} is not a multiple of the page size {page:#x}"),
        )));
    }
    let cap = capacity.div_ceil(chunk) * chunk;
    let r = py.detach(|| c.reserve(None, cap)).py()?;
    let place = if c.driver().backend_kind() == hetmem::BackendKind::Host {
        Place::Host
    } else {
        Place::CudaDevice(device)
    };
    let region = Region::new(
        c.clone(),
        r.base,
        r.size,
        false,
        RegionKind::Plain,
        Some(place),
    );
    let sh = Arc::new(GrowShared {
        st: Mutex::new(GrowState {
            dev,
            chunk,
            size: 0,
            mapped: Vec::new(),
            pool: Vec::new(),
            ahead: prefetch,
            making: 0,
            cap_chunks: r.size / chunk,
            stop: false,
            prefetch_error: None,
        }),
        cv: parking_lot::Condvar::new(),
    });
    let g = Growable {
        region: region.clone(),
        sh: sh.clone(),
        itemsize,
        worker: Mutex::new(None),
    };
    if prefetch > 0 {
        let c2 = c.clone();
        // On an error `g` goes, freeing the reservation.
        let t = std::thread::Builder::new()
            .name("hetmem-growable-prefetch".into())
            .spawn(move || prefetch_loop(sh, c2))
            .map_err(|e| PyRuntimeError::new_err(format!("starting the prefetch thread: {e}")))?;
        *g.worker.lock() = Some(t);
    }
    Py::new(
        py,
        PyClassInitializer::from(Memory::whole(region)).add_subclass(g),
    )
}

fn device_of(ctx: &hetmem::Context, dev: u32) -> hetmem::Result<hetmem::Device> {
    device(ctx, dev)
}

/// Adds the functions and classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Growable>()?;
    m.add_function(wrap_pyfunction!(growable, m)?)?;
    m.add_function(wrap_pyfunction!(torch_init, m)?)?;
    m.add_function(wrap_pyfunction!(torch_context, m)?)?;
    m.add_function(wrap_pyfunction!(torch_set_tag, m)?)?;
    m.add_function(wrap_pyfunction!(torch_malloc, m)?)?;
    m.add_function(wrap_pyfunction!(torch_free, m)?)?;
    m.add_function(wrap_pyfunction!(torch_sleep, m)?)?;
    m.add_function(wrap_pyfunction!(torch_wake, m)?)?;
    m.add_function(wrap_pyfunction!(torch_blocks, m)?)?;
    m.add_function(wrap_pyfunction!(torch_block_of, m)?)?;
    m.add_function(wrap_pyfunction!(torch_span, m)?)?;
    m.add_function(wrap_pyfunction!(torch_share, m)?)?;
    m.add_function(wrap_pyfunction!(torch_stats, m)?)?;
    m.add_function(wrap_pyfunction!(torch_last_error, m)?)?;
    Ok(())
}
