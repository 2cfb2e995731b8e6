//! Recorded commands (copies, fills, signals, waits), their memory operands, and the operand
//! rule of the module docs of [`crate::semantics::queue`]: every operand lies wholly inside
//! live memory of the driver with the access it needs, checked under the driver's read locks
//! (lock order of [`crate::semantics::driver`]) and held in flight until the work has run.

use std::sync::Arc;

use crate::backend::{EngineOp, EngineSync};
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

/// Which spec's operand rule a queue operation follows for memory the driver does not know
/// (see the module docs of [`crate::semantics::queue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperandRule {
    /// Level Zero (`zeCommandListAppendMemoryCopy` / `...MemoryFill`): plain system memory
    /// of the process (`malloc`, `new[]`, the stack) is an operand where it is mapped with
    /// the access needed; `sharedSystemAllocCapabilities` reports it.
    LevelZero,
    /// ACL streams (`aclrtMemcpyAsync`, `aclrtMemsetAsync`) and ACL's device-side holds: only
    /// memory the runtime knows; plain system memory is `InvalidArgument` (ACL 107000).
    Acl,
}

/// Checks one operand against live memory under `rule` (see the module docs); returns what it
/// references (the USM allocation, the reservation, the IPC view, or system memory).
pub(crate) fn check_operand(
    d: &DriverShared,
    usm: &UsmState,
    vm: &VmState,
    views: &crate::semantics::ipc::Views<'_>,
    op: Operand,
    rule: OperandRule,
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
        None if rule == OperandRule::LevelZero => system_operand(d, usm, vm, op, what, end),
        None => Err(Error::InvalidArgument(format!(
            "{what} {} is not inside a USM allocation, an import, an opened IPC view or a \
             virtual-memory reservation (memory the runtime knows)",
            Addr(op.ptr)
        ))),
    }
}

/// An operand in none of the driver's memory: plain system memory of the process (`malloc`,
/// `new[]`, the stack) is accepted where the process has it mapped with the access needed
/// (the backend reads the process's mappings; nothing is touched), and is not held against
/// frees. Both backends reach it: the host backend's engines are threads of this process, and
/// the cuda backend stages pageable memory through pinned buffers (`SYSTEM_MEMORY_IN_QUEUES`).
/// A range of which any byte is not mapped is `InvalidArgument`, found without touching it.
fn system_operand(
    d: &DriverShared,
    usm: &UsmState,
    vm: &VmState,
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
    // Memory of the driver is never system memory: a range that runs into it, or into an
    // allocation freed while queued work still holds it (its pages are still mapped).
    if let Some((b, e)) = usm.overlapping(op.ptr, end) {
        return not(&format!(
            "runs into the allocation [{}, {}) without lying inside it",
            Addr(b),
            Addr(e)
        ));
    }
    if vm.reservation_overlaps(op.ptr, end) {
        return not("runs into a virtual-memory reservation");
    }
    if let Some((b, e)) = d.inflight.retiring_overlapping(op.ptr, end.max(op.ptr + 1)) {
        return not(&format!(
            "lies in the allocation [{}, {}), freed (its memory is held until queued work on it \
             has run, or is being released)",
            Addr(b),
            Addr(e)
        ));
    }
    // A size of 0 still checks its pointer: the byte it names.
    match d.backend.query_host_protection(op.ptr, op.size.max(1)) {
        None => not("is not mapped system memory of this process"),
        Some(Protection::None) => not("system memory of this process there is not readable"),
        Some(Protection::ReadOnly) if op.write => {
            not("system memory of this process there is not writable")
        }
        Some(_) => Ok(InFlightRef::System),
    }
}

/// Checks every operand under `rule`, under the driver's read locks and the IPC view table
/// (usm, vm, views: the lock order); if `hold`, records the in-flight references before the
/// locks are dropped, so no free, unmap or close can slip in between.
pub(crate) fn check_all(
    d: &DriverShared,
    cmds: &[Cmd],
    hold: bool,
    rule: OperandRule,
) -> Result<Vec<InFlightRef>> {
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
            ids.push(check_operand(d, &usm, &vm, &views, op, rule)?);
        }
    }
    ids.sort_unstable();
    ids.dedup();
    // System memory is the program's: nothing holds it.
    ids.retain(|r| *r != InFlightRef::System);
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

/// Checks `o` as an ACL queue operand ([`check_operand`] under [`OperandRule::Acl`]: memory
/// the runtime knows; under the reservation's gate so that no set-access slips in, see
/// `crate::semantics::access`) and holds it in flight until the returned guard drops, so a
/// free of its memory waits.
///
/// Errors: those of [`check_operand`] (`InvalidArgument`, `InvalidNullPointer`).
pub(crate) fn hold(d: &Arc<DriverShared>, o: Operand) -> Result<HeldOperand> {
    let usm = d.usm.read();
    let vm = d.vm.read();
    let views = crate::semantics::ipc::views(d);
    let gates = vm.gates_for([o.ptr]);
    let _held: Vec<_> = gates.iter().map(|p| p.exclusive()).collect();
    let r = check_operand(d, &usm, &vm, &views, o, OperandRule::Acl)?;
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
            self.driver.inflight.finish(p, self.driver.backend.as_ref());
        }
    }
}
