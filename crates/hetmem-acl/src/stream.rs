//! Streams and events: `aclrtCreateStream`, `aclrtDestroyStream`, `aclrtSynchronizeStream`,
//! `aclrtSynchronizeDevice`, `aclrtCreateEvent`, `aclrtRecordEvent`, `aclrtStreamWaitEvent`,
//! `aclrtSynchronizeEvent`, `aclrtQueryEventStatus`, `aclrtDestroyEvent`.
//!
//! An ACL stream is a [`hetmem::Stream`] (in order, on its context's device: managed copies,
//! fills, prefetches) where managed memory is available; copies and fills between plain memory
//! (device / host allocations, mapped virtual memory) go to an immediate command list of the
//! same device and are kept in stream order with two events (the stream signals the first when
//! it reaches the copy, the list waits for it, copies and signals the second, the stream waits
//! for that). Where managed memory is unavailable (no userfaultfd) the stream is the immediate
//! command list alone. Event records and waits are stream-ordered host steps.
//!
//! An ACL event holds the hetmem event of its latest record: recording makes a fresh one, so a
//! wait always waits for the latest record made before it. An event never recorded is complete
//! (`aclrtQueryEventStatus` answers COMPLETE; waits on it return at once), as CUDA's are.

use std::sync::Arc;

use parking_lot::Mutex;

use crate::state::{self, Ctx, Global};
use crate::{entry, null, out, AclError, Res};

/// How a stream executes.
#[derive(Debug)]
enum Engine {
    /// A hetmem stream, with an immediate list (made on first use) for plain-memory work.
    Managed {
        stream: hetmem::Stream,
        list: Mutex<Option<hetmem::CommandList>>,
    },
    /// No managed memory here: the immediate list alone.
    Plain(hetmem::CommandList),
}

/// An ACL stream (`aclrtStream`).
#[derive(Debug)]
pub struct AclStream {
    /// The handle given to C (0 for a context's default stream).
    pub handle: usize,
    /// The context it was created in.
    pub ctx: Arc<Ctx>,
    engine: Engine,
}

/// An ACL event (`aclrtEvent`).
#[derive(Debug)]
pub struct AclEvent {
    /// The handle given to C.
    pub handle: usize,
    /// The context it was created in (makes the hetmem events of its records).
    pub ctx: Arc<Ctx>,
    /// The hetmem event of the latest record; `None` before the first.
    latest: Mutex<Option<hetmem::Event>>,
}

impl state::Object for AclStream {
    fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }
    fn quiesce(&self) {
        let _ = self.synchronize();
    }
}

impl state::Object for AclEvent {
    fn ctx(&self) -> &Arc<Ctx> {
        &self.ctx
    }
}

impl Global {
    /// The stream `h`; `0` (NULL) is the current context's default stream.
    ///
    /// Errors: `InvalidArgument` (107000) for a handle that is not a live stream;
    /// `ACL_ERROR_RT_CONTEXT_NULL` for NULL without a current context.
    pub fn stream(&self, h: usize) -> Res<Arc<AclStream>> {
        if h == 0 {
            let ctx = self.current()?;
            return default_stream(self, &ctx);
        }
        self.object(h, "stream")
    }

    /// The event `h`.
    ///
    /// Errors: `InvalidArgument` (107000) for a handle that is not a live event.
    pub fn event(&self, h: usize) -> Res<Arc<AclEvent>> {
        self.object(h, "event")
    }
}

impl AclStream {
    /// A stream on `ctx`'s device.
    pub fn new(ctx: &Arc<Ctx>, handle: usize) -> Res<AclStream> {
        let engine =
            match ctx.ctx.create_stream(&ctx.dev) {
                Ok(stream) => Engine::Managed {
                    stream,
                    list: Mutex::new(None),
                },
                // Managed memory unavailable here (no userfaultfd): streams run plain work only.
                Err(e) if e.acl_error() == hetmem::AclCode::RtFeatureNotSupport as u32 => {
                    Engine::Plain(ctx.ctx.create_immediate_command_list_for(
                        &ctx.dev,
                        hetmem::queue::OperandRule::Acl,
                    )?)
                }
                Err(e) => return Err(e.into()),
            };
        Ok(AclStream {
            handle,
            ctx: ctx.clone(),
            engine,
        })
    }

    /// The hetmem stream (managed memory work).
    ///
    /// Errors: `UnsupportedFeature` (207000) where managed memory is unavailable.
    pub fn managed(&self) -> Res<&hetmem::Stream> {
        match &self.engine {
            Engine::Managed { stream, .. } => Ok(stream),
            Engine::Plain(_) => Err(hetmem::Error::UnsupportedFeature(
                "managed memory is unavailable on this machine (userfaultfd refused), so \
                 streams run plain-memory work only"
                    .into(),
            )
            .into()),
        }
    }

    /// Waits for everything submitted (`aclrtSynchronizeStream`); the first error of the work
    /// since the last synchronize.
    pub fn synchronize(&self) -> Res {
        match &self.engine {
            Engine::Managed { stream, .. } => stream.synchronize()?,
            Engine::Plain(list) => {
                list.host_synchronize(u64::MAX)?;
            }
        }
        Ok(())
    }

    /// Discards the stream's queued work that has not started (`aclrtDestroyStreamForce`):
    /// the stream steps are dropped unrun ([`hetmem::Stream::discard_queued`]), releasing
    /// what they held; a plain-memory copy or fill waiting on its list for a discarded step is
    /// skipped when the list is dropped with the stream (the list abandons a wait that can no
    /// longer be satisfied). Without managed memory (a stream that is its list alone) queued
    /// work cannot be told apart from work the device has and runs to its end.
    pub fn discard_queued(&self) {
        if let Engine::Managed { stream, .. } = &self.engine {
            stream.discard_queued();
        }
    }

    /// Runs `op` on an immediate list in stream order (see the module docs): `op` appends to
    /// the list with the wait and signal events it is given.
    fn plain(
        &self,
        op: impl FnOnce(
            &hetmem::CommandList,
            Option<&hetmem::Event>,
            &[&hetmem::Event],
        ) -> hetmem::Result<()>,
    ) -> Res {
        match &self.engine {
            Engine::Plain(list) => op(list, None, &[])?,
            Engine::Managed { stream, list } => {
                let mut l = list.lock();
                if l.is_none() {
                    *l = Some(self.ctx.ctx.create_immediate_command_list_for(
                        &self.ctx.dev,
                        hetmem::queue::OperandRule::Acl,
                    )?);
                }
                let list = l.as_ref().expect("made above");
                let reached = self.ctx.ctx.create_event()?;
                let done = self.ctx.ctx.create_event()?;
                op(list, Some(&done), &[&reached])?;
                let r = reached.clone();
                stream.launch(&[], move |_| {
                    let _ = r.host_signal();
                })?;
                stream.launch(&[], move |_| {
                    let _ = done.host_synchronize(u64::MAX);
                })?;
            }
        }
        Ok(())
    }

    /// Stream-ordered copy of `count` bytes: a managed side goes through the hetmem stream,
    /// plain memory through the list.
    pub fn memcpy(&self, dst: usize, src: usize, count: usize) -> Res {
        if dst == 0 || src == 0 {
            return Err(null("a copy pointer"));
        }
        let c = &self.ctx.ctx;
        if c.is_managed(dst) || c.is_managed(src) {
            return Ok(self.managed()?.memcpy_async(dst, src, count)?);
        }
        self.plain(|l, signal, wait| l.append_memory_copy(dst, src, count, signal, wait))
    }

    /// Stream-ordered fill of `count` bytes with `value`.
    pub fn memset(&self, ptr: usize, value: u8, count: usize) -> Res {
        if ptr == 0 {
            return Err(null("devPtr"));
        }
        if self.ctx.ctx.is_managed(ptr) {
            return Ok(self.managed()?.memset_async(ptr, value, count)?);
        }
        self.plain(|l, signal, wait| l.append_memory_fill(ptr, &[value], count, signal, wait))
    }

    /// Stream-ordered fill of `count` bytes with the repeated `pattern` (`aclrtMemsetD32Async`):
    /// plain memory through the list's pattern fill; managed memory only when the pattern's
    /// bytes are all one byte (managed fills take one byte).
    pub fn fill_pattern(&self, ptr: usize, pattern: &[u8], count: usize) -> Res {
        if self.ctx.ctx.is_managed(ptr) {
            if pattern.iter().all(|&b| b == pattern[0]) {
                return Ok(self.managed()?.memset_async(ptr, pattern[0], count)?);
            }
            return Err(hetmem::Error::UnsupportedFeature(
                "a multi-byte pattern fill of managed memory on a stream: managed stream fills \
                 take one byte (use aclrtMemsetD32, or device memory)"
                    .into(),
            )
            .into());
        }
        self.plain(|l, signal, wait| l.append_memory_fill(ptr, pattern, count, signal, wait))
    }

    /// Signals `ev` when the stream reaches this point.
    fn signal(&self, ev: hetmem::Event) -> Res {
        match &self.engine {
            Engine::Managed { stream, .. } => stream.launch(&[], move |_| {
                let _ = ev.host_signal();
            })?,
            Engine::Plain(list) => list.append_signal_event(&ev)?,
        }
        Ok(())
    }

    /// Later work of the stream waits for `ev`.
    fn wait(&self, ev: hetmem::Event) -> Res {
        match &self.engine {
            Engine::Managed { stream, .. } => stream.launch(&[], move |_| {
                let _ = ev.host_synchronize(u64::MAX);
            })?,
            Engine::Plain(list) => list.append_wait_on_events(&[&ev])?,
        }
        Ok(())
    }
}

/// The default stream of `ctx` (`stream == NULL`), made on first use.
pub fn default_stream(_g: &Global, ctx: &Arc<Ctx>) -> Res<Arc<AclStream>> {
    let mut d = ctx.default_stream.lock();
    if let Some(s) = d.clone().and_then(state::downcast::<AclStream>) {
        return Ok(s);
    }
    let s = Arc::new(AclStream::new(ctx, 0)?);
    *d = Some(s.clone());
    Ok(s)
}

/// `aclrtCreateStream`: an in-order stream on the current context's device.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002) without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut *mut libc::c_void) -> AclError {
    entry("aclrtCreateStream", || {
        let g = state::fast_global()?;
        if stream.is_null() {
            return Err(null("stream"));
        }
        let ctx = g.current()?;
        let h = state::fresh_handle(2);
        let s = Arc::new(AclStream::new(ctx, h)?);
        g.reg.lock().objects.insert(h, s);
        // SAFETY: non-null out-pointer.
        unsafe { out(stream, h as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtDestroyStream`: waits for the stream's work, then releases it.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live stream
/// (`ACL_ERROR_INVALID_PARAM` for NULL).
#[no_mangle]
pub extern "C" fn aclrtDestroyStream(stream: *mut libc::c_void) -> AclError {
    entry("aclrtDestroyStream", || {
        let g = state::fast_global()?;
        let h = stream as usize;
        let s = g
            .reg
            .lock()
            .remove::<AclStream>(h)
            .ok_or_else(|| state::bad_handle("stream", h))?;
        let _ = s.synchronize();
        Ok(())
    })
}

/// `aclrtSynchronizeStream`: waits for everything submitted to `stream` (NULL: the current
/// context's default stream).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live stream; the
/// first error of the stream's work since the last synchronize (e.g. 207001 when a prefetch
/// found the device full); the stream stays usable.
#[no_mangle]
pub extern "C" fn aclrtSynchronizeStream(stream: *mut libc::c_void) -> AclError {
    entry("aclrtSynchronizeStream", || {
        let g = state::fast_global()?;
        g.stream(stream as usize)?.synchronize()
    })
}

/// `aclrtSynchronizeDevice`: waits for every stream of the current device (all contexts).
///
/// Errors: `ACL_ERROR_RT_CONTEXT_NULL` (107002) without a current context; the first error of
/// the streams' work.
#[no_mangle]
pub extern "C" fn aclrtSynchronizeDevice() -> AclError {
    entry("aclrtSynchronizeDevice", || {
        let g = state::fast_global()?;
        let dev = g.current()?.dev.ordinal();
        let streams: Vec<Arc<AclStream>> = {
            let reg = g.reg.lock();
            let mut v: Vec<Arc<AclStream>> = reg
                .all::<AclStream>()
                .filter(|s| s.ctx.dev.ordinal() == dev)
                .collect();
            for c in reg.contexts.values().filter(|c| c.dev.ordinal() == dev) {
                if let Some(s) = c.default_stream.lock().clone().and_then(state::downcast) {
                    v.push(s);
                }
            }
            v
        };
        let mut first = Ok(());
        for s in streams {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    })
}

/// `aclrtCreateEvent`: an event in the current context, never recorded (complete).
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_CONTEXT_NULL`
/// (107002) without a current context.
#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(event: *mut *mut libc::c_void) -> AclError {
    entry("aclrtCreateEvent", || {
        let g = state::fast_global()?;
        if event.is_null() {
            return Err(null("event"));
        }
        let ctx = g.current()?;
        let h = state::fresh_handle(3);
        g.reg.lock().objects.insert(
            h,
            Arc::new(AclEvent {
                handle: h,
                ctx: ctx.clone(),
                latest: Mutex::new(None),
            }),
        );
        // SAFETY: non-null out-pointer.
        unsafe { out(event, h as *mut libc::c_void) };
        Ok(())
    })
}

/// `aclrtDestroyEvent`: releases the event; streams already waiting on one of its records keep
/// waiting for it.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live event.
#[no_mangle]
pub extern "C" fn aclrtDestroyEvent(event: *mut libc::c_void) -> AclError {
    entry("aclrtDestroyEvent", || {
        let g = state::fast_global()?;
        let h = event as usize;
        let e = g.reg.lock().remove::<AclEvent>(h);
        e.map(|_| ()).ok_or_else(|| state::bad_handle("event", h))
    })
}

/// `aclrtRecordEvent`: the event completes when `stream` (NULL: the default stream) reaches
/// this point; until then it is NOT_READY. A new record replaces the previous one.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for an event or stream that is not live.
#[no_mangle]
pub extern "C" fn aclrtRecordEvent(
    event: *mut libc::c_void,
    stream: *mut libc::c_void,
) -> AclError {
    entry("aclrtRecordEvent", || {
        let g = state::fast_global()?;
        let e = g.event(event as usize)?;
        let s = g.stream(stream as usize)?;
        let fresh = e.ctx.ctx.create_event()?;
        s.signal(fresh.clone())?;
        *e.latest.lock() = Some(fresh);
        Ok(())
    })
}

/// `aclrtStreamWaitEvent`: later work of `stream` waits until the event's latest record (made
/// before this call) has completed; nothing to wait for if it was never recorded.
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for an event or stream that is not live.
#[no_mangle]
pub extern "C" fn aclrtStreamWaitEvent(
    stream: *mut libc::c_void,
    event: *mut libc::c_void,
) -> AclError {
    entry("aclrtStreamWaitEvent", || {
        let g = state::fast_global()?;
        let s = g.stream(stream as usize)?;
        let e = g.event(event as usize)?;
        let latest = e.latest.lock().clone();
        match latest {
            Some(ev) => s.wait(ev),
            None => Ok(()),
        }
    })
}

/// `aclrtSynchronizeEvent`: waits until the event's latest record has completed (returns at
/// once if it was never recorded).
///
/// Errors: `ACL_ERROR_RT_PARAM_INVALID` (107000) for a handle that is not a live event.
#[no_mangle]
pub extern "C" fn aclrtSynchronizeEvent(event: *mut libc::c_void) -> AclError {
    entry("aclrtSynchronizeEvent", || {
        let g = state::fast_global()?;
        let e = g.event(event as usize)?;
        let latest = e.latest.lock().clone();
        if let Some(ev) = latest {
            ev.host_synchronize(u64::MAX)?;
        }
        Ok(())
    })
}

/// `aclrtQueryEventStatus`: `ACL_EVENT_RECORDED_STATUS_COMPLETE` (1) if the latest record has
/// completed or there was none, else `ACL_EVENT_RECORDED_STATUS_NOT_READY` (0). Never waits.
///
/// Errors: `ACL_ERROR_INVALID_PARAM` (100000) for a null pointer; `ACL_ERROR_RT_PARAM_INVALID`
/// (107000) for a handle that is not a live event.
#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEventStatus(
    event: *mut libc::c_void,
    status: *mut u32,
) -> AclError {
    entry("aclrtQueryEventStatus", || {
        let g = state::fast_global()?;
        let e = g.event(event as usize)?;
        if status.is_null() {
            return Err(null("status"));
        }
        let latest = e.latest.lock().clone();
        let done = match latest {
            Some(ev) => ev.query_status()? == hetmem::SyncStatus::Ready,
            None => true,
        };
        // SAFETY: non-null out-pointer.
        unsafe { out(status, done as u32) };
        Ok(())
    })
}
