//! Recorded commands (copies, fills, signals, waits), their memory operands, and the operand
//! rule of the module docs of [`crate::semantics::queue`]: every operand lies wholly inside
//! live memory of the driver with the access it needs, checked under the driver's read locks
//! (lock order of [`crate::semantics::driver`]) and held in flight until the work has run.

use std::sync::Arc;

use crate::backend::{Backend, EngineOp, EngineSync};
use crate::error::{Addr, Error, Result};
use crate::semantics::driver::DriverShared;
use crate::semantics::inflight::InFlightRef;
use crate::semantics::usm::UsmState;
use crate::semantics::vmm::VmState;

/// One memory operand of a command.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand {
    pub(crate) ptr: usize,
    pub(crate) size: usize,
    pub(crate) write: bool,
}

/// Checks one operand against live memory (see the module docs); returns what it references
/// (the USM allocation, the reservation or the IPC view).
pub(crate) fn check_operand(
    backend: &dyn Backend,
    usm: &UsmState,
    vm: &VmState,
    views: &crate::semantics::ipc::Views<'_>,
    op: Operand,
) -> Result<InFlightRef> {
    let what = if op.write { "destination" } else { "source" };
    if op.ptr == 0 {
        return Err(Error::InvalidNullPointer(format!("{what} pointer is null")));
    }
    let end = op.ptr.checked_add(op.size).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{what} {} + {:#x} overflows",
            Addr(op.ptr),
            op.size
        ))
    })?;
    if let Some((base, size, id, read_only)) = usm.operand_info(op.ptr) {
        if end > base + size {
            return Err(Error::InvalidArgument(format!(
                "{what} [{}, {}) runs past the end {} of its allocation at {}",
                Addr(op.ptr),
                Addr(end),
                Addr(base + size),
                Addr(base)
            )));
        }
        if op.write && read_only {
            return Err(Error::InvalidArgument(format!(
                "{what} {} is in an import recorded read-only",
                Addr(op.ptr)
            )));
        }
        return Ok(InFlightRef::Usm(id));
    }
    if let Some((base, size)) = views.range(op.ptr) {
        // Views are mapped read-write for their whole size (see `crate::ipc`).
        if end > base + size {
            return Err(Error::InvalidArgument(format!(
                "{what} [{}, {}) runs past the end {} of the IPC view at {}",
                Addr(op.ptr),
                Addr(end),
                Addr(base + size),
                Addr(base)
            )));
        }
        return Ok(InFlightRef::View(base));
    }
    match vm.check_device_access(op.ptr, end, op.write) {
        Some(Ok(())) => match vm.pointer_info(op.ptr) {
            Some(info) => Ok(InFlightRef::Reservation(info.reservation.0)),
            None => Err(Error::InvalidArgument(format!(
                "{what} {} is not inside a reservation",
                Addr(op.ptr)
            ))),
        },
        Some(Err(why)) => Err(Error::InvalidArgument(format!("{what}: {why}"))),
        None => system_operand(backend, op, what, end),
    }
}

/// An operand in none of the driver's memory: plain system memory of the process (`malloc`,
/// `new[]`, the stack) is accepted where the process has it mapped with the access needed
/// (the backend reads the process's mappings; nothing is touched), and is not held against
/// frees. Both backends reach it: the host backend's engines are threads of this process, and
/// CUDA copies pageable memory (`SYSTEM_MEMORY_IN_QUEUES`).
fn system_operand(
    backend: &dyn Backend,
    op: Operand,
    what: &str,
    end: usize,
) -> Result<InFlightRef> {
    use crate::backend::Protection;
    let not = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "{what} [{}, {}) is not inside a USM allocation, an import, an opened IPC view or a \
             virtual-memory reservation, and {why}",
            Addr(op.ptr),
            Addr(end)
        )))
    };
    if op.size == 0 {
        return Ok(InFlightRef::System);
    }
    match backend.query_host_protection(op.ptr, op.size) {
        None => not("is not mapped system memory of this process"),
        Some(Protection::None) => not("system memory of this process there is not readable"),
        Some(Protection::ReadOnly) if op.write => {
            not("system memory of this process there is not writable")
        }
        Some(_) => Ok(InFlightRef::System),
    }
}

/// Checks every operand under the driver's read locks and the IPC view table (usm, vm, views:
/// the lock order); if `hold`, records the in-flight references before the locks are dropped,
/// so no free, unmap or close can slip in between.
pub(crate) fn check_all(d: &DriverShared, cmds: &[Cmd], hold: bool) -> Result<Vec<InFlightRef>> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views(d);
    // The gates of the reservations the operands lie in, in address order: no set-access on
    // them runs between the access check and the references (see `crate::semantics::access`).
    let gates = if hold {
        vm.gates_for(cmds.iter().flat_map(|c| c.operands()).map(|op| op.ptr))
    } else {
        Vec::new()
    };
    let _held: Vec<_> = gates.iter().map(|p| p.exclusive()).collect();
    let mut ids = Vec::new();
    for c in cmds {
        for op in c.operands() {
            ids.push(check_operand(d.backend.as_ref(), &usm, &vm, &views, op)?);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    if hold {
        d.inflight.acquire(&ids);
    }
    Ok(ids)
}

/// A recorded command.
#[derive(Debug, Clone)]
pub(crate) enum Cmd {
    Copy {
        dst: usize,
        src: usize,
        size: usize,
    },
    Fill {
        ptr: usize,
        pattern: Vec<u8>,
        size: usize,
    },
    /// Signals an event's sync object.
    Signal(Arc<dyn EngineSync>),
    /// Waits for every one of these events' sync objects; each comes with its event's wait
    /// token, taken (upgraded) when the command is queued and held by the engine until the
    /// waits are over, so that the event can tell queued work waits on it
    /// ([`crate::Event::check_destroy`]); a command merely recorded in a list does not hold it.
    Wait(Vec<(Arc<dyn EngineSync>, std::sync::Weak<()>)>),
}

impl Cmd {
    /// The memory operands of the command (at most two; no allocation on the submit path).
    pub(crate) fn operands(&self) -> impl Iterator<Item = Operand> {
        let ops = match *self {
            Cmd::Copy { dst, src, size } => [
                Some(Operand {
                    ptr: dst,
                    size,
                    write: true,
                }),
                Some(Operand {
                    ptr: src,
                    size,
                    write: false,
                }),
            ],
            Cmd::Fill { ptr, size, .. } => [
                Some(Operand {
                    ptr,
                    size,
                    write: true,
                }),
                None,
            ],
            Cmd::Signal(_) | Cmd::Wait(_) => [None, None],
        };
        ops.into_iter().flatten()
    }
}

/// The engine operations of `cmds`, in order.
pub(crate) fn engine_ops(cmds: &[Cmd]) -> Vec<EngineOp> {
    let mut ops = Vec::with_capacity(cmds.len() + 1);
    for c in cmds {
        match c {
            &Cmd::Copy { dst, src, size } => ops.push(EngineOp::Copy { dst, src, size }),
            Cmd::Fill { ptr, pattern, size } => ops.push(EngineOp::Fill {
                ptr: *ptr,
                pattern: pattern.clone(),
                size: *size,
            }),
            Cmd::Signal(e) => ops.push(EngineOp::Signal(e.clone())),
            // One wait per event: the batch goes on once all are signalled.
            Cmd::Wait(evs) => {
                ops.extend(evs.iter().map(|e| EngineOp::Wait(e.0.clone())));
                // The events stay "waited on" until the waits are over (not until the batch
                // ends: a host woken by a later signal of this batch may destroy them).
                let tokens: Vec<Arc<()>> = evs.iter().filter_map(|e| e.1.upgrade()).collect();
                ops.push(EngineOp::Host(Box::new(move || drop(tokens))));
            }
        }
    }
    ops
}

/// The device whose memory `ptr` is: a device USM allocation's device, or the device of the
/// physical memory mapped at a reserved address; `None` for anything else.
pub(crate) fn owning_device(d: &DriverShared, ptr: usize) -> Option<u32> {
    if let Some((_, r)) = d.usm.read().find(ptr) {
        return r.device;
    }
    match d.vm.read().pointer_info(ptr)?.mapped? {
        (_, crate::backend::PhysicalLocation::Device(dev), _) => Some(dev),
        _ => None,
    }
}

/// Checks `o` as a queue operand ([`check_operand`], under the reservation's gate so that no
/// set-access slips in, see `crate::semantics::access`) and holds it in flight until the
/// returned guard drops, so a free of its memory waits.
///
/// Errors: those of [`check_operand`] (`InvalidArgument`, `InvalidNullPointer`).
pub(crate) fn hold(d: &Arc<DriverShared>, o: Operand) -> Result<HeldOperand> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views(d);
    let gates = vm.gates_for([o.ptr]);
    let _held: Vec<_> = gates.iter().map(|p| p.exclusive()).collect();
    let r = check_operand(d.backend.as_ref(), &usm, &vm, &views, o)?;
    d.inflight.acquire(&[r]);
    Ok(HeldOperand {
        driver: d.clone(),
        r,
    })
}

/// An operand's in-flight reference, released on drop ([`crate::CommandQueue`]'s `hold_operand`).
#[derive(Debug)]
pub(crate) struct HeldOperand {
    pub(crate) driver: Arc<DriverShared>,
    pub(crate) r: InFlightRef,
}

impl Drop for HeldOperand {
    fn drop(&mut self) {
        for p in self.driver.inflight.release(&[self.r]) {
            p.finish(self.driver.backend.as_ref());
        }
    }
}
