//! One test per rule that the Level Zero driver (`hetmem-ze`) once decided itself and that now
//! lives in hetmem (issue 9 review): queue and command-list descriptors, event pools, fences
//! created signalled, memory advice, system-memory import sizes, flag sets, physical memory
//! properties, and the one-context rule of queues, lists and events. Rust and C callers get the
//! same answer from the same code.
//!
//! On the backend under test (`HETMEM_BACKEND`): these rules are the semantics layer's, and the
//! memory they touch (host USM, imports of system memory, one physical page) is the same on
//! every backend, so every test runs unchanged on cuda.

mod common;

use common::runtime_with;
use common::ze::{INVALID_ARGUMENT, INVALID_ENUMERATION, INVALID_SIZE};

use hetmem::{
    AllocDesc, CommandListDesc, CommandQueueDesc, Context, Device, FlagSet, MemoryAdvice,
    PhysicalMemoryFlags, QueueMode, QueuePriority, Runtime, SyncStatus, QUEUES_PER_GROUP,
};

const MIB: usize = 1 << 20;

fn setup() -> (Runtime, Device, Context) {
    let rt = runtime_with(1, 64 << 20);
    let dev = rt.driver().device(0).unwrap();
    let ctx = rt.driver().create_context().unwrap();
    (rt, dev, ctx)
}

fn code<T: std::fmt::Debug>(r: hetmem::Result<T>) -> u32 {
    r.expect_err("expected an error").ze_result()
}

fn msg<T: std::fmt::Debug>(r: hetmem::Result<T>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn queue_desc_ordinal_must_be_0() {
    if common::skip() {
        return;
    }
    assert_eq!(
        code(CommandQueueDesc::from_raw(1, 0, 0, 0, 0)),
        INVALID_ARGUMENT
    );
    assert!(msg(CommandQueueDesc::from_raw(7, 0, 0, 0, 0)).contains("ordinal 7"));
    let (_rt, dev, ctx) = setup();
    let bad = CommandQueueDesc {
        ordinal: 2,
        ..CommandQueueDesc::default()
    };
    assert_eq!(
        code(ctx.create_command_queue_with(&dev, &bad)),
        INVALID_ARGUMENT
    );
    assert_eq!(
        code(ctx.create_immediate_command_list_with(&dev, &bad)),
        INVALID_ARGUMENT
    );
    assert!(ctx
        .create_command_queue_with(&dev, &CommandQueueDesc::default())
        .is_ok());
}

#[test]
fn queue_desc_index_below_queues_per_group() {
    if common::skip() {
        return;
    }
    assert!(CommandQueueDesc::from_raw(0, QUEUES_PER_GROUP - 1, 0, 0, 0).is_ok());
    assert_eq!(
        code(CommandQueueDesc::from_raw(0, QUEUES_PER_GROUP, 0, 0, 0)),
        INVALID_ARGUMENT
    );
    assert!(msg(CommandQueueDesc::from_raw(0, 64, 0, 0, 0)).contains("index 64"));
}

#[test]
fn queue_desc_mode_at_most_asynchronous() {
    if common::skip() {
        return;
    }
    let d = CommandQueueDesc::from_raw(0, 0, 0, 2, 0).unwrap();
    assert_eq!(d.mode, QueueMode::Asynchronous);
    assert!(!d.is_synchronous());
    assert!(CommandQueueDesc::from_raw(0, 0, 0, 1, 0)
        .unwrap()
        .is_synchronous());
    assert_eq!(
        code(CommandQueueDesc::from_raw(0, 0, 0, 3, 0)),
        INVALID_ENUMERATION
    );
    assert!(msg(CommandQueueDesc::from_raw(0, 0, 0, 7, 0)).contains("mode 7"));
}

#[test]
fn queue_desc_priority_at_most_high() {
    if common::skip() {
        return;
    }
    assert_eq!(
        CommandQueueDesc::from_raw(0, 0, 0, 0, 2).unwrap().priority,
        QueuePriority::High
    );
    assert_eq!(
        code(CommandQueueDesc::from_raw(0, 0, 0, 0, 3)),
        INVALID_ENUMERATION
    );
    assert!(msg(CommandQueueDesc::from_raw(0, 0, 0, 0, 9)).contains("priority 9"));
}

#[test]
fn queue_desc_flags_within_their_set() {
    if common::skip() {
        return;
    }
    assert!(CommandQueueDesc::from_raw(0, 0, 0x3, 0, 0).is_ok());
    assert_eq!(
        code(CommandQueueDesc::from_raw(0, 0, 0x4, 0, 0)),
        INVALID_ENUMERATION
    );
}

#[test]
fn command_list_desc_ordinal_must_be_0() {
    if common::skip() {
        return;
    }
    assert!(CommandListDesc::from_raw(0, 0x1f).is_ok());
    assert_eq!(code(CommandListDesc::from_raw(3, 0)), INVALID_ARGUMENT);
    assert!(msg(CommandListDesc::from_raw(3, 0)).contains("commandQueueGroupOrdinal 3"));
    assert_eq!(
        code(CommandListDesc::from_raw(0, 0x20)),
        INVALID_ENUMERATION
    );
    let (_rt, dev, ctx) = setup();
    let bad = CommandListDesc {
        ordinal: 1,
        flags: 0,
    };
    assert_eq!(
        code(ctx.create_command_list_with(&dev, &bad)),
        INVALID_ARGUMENT
    );
}

#[test]
fn event_pool_count_0_is_invalid_size() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    assert_eq!(code(ctx.create_event_pool(0)), INVALID_SIZE);
    assert_eq!(ctx.create_event_pool(1).unwrap().count(), 1);
}

#[test]
fn event_index_below_pool_count() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let p = ctx.create_event_pool(4).unwrap();
    assert!(p.create_event(3).is_ok());
    assert_eq!(code(p.create_event(4)), INVALID_ARGUMENT);
    assert!(msg(p.create_event(9)).contains("event index 9"));
    // A pool of 2^32 - 1 events: its last index works.
    let big = ctx.create_event_pool(u32::MAX).unwrap();
    let e = big.create_event(u32::MAX - 1).unwrap();
    e.host_signal().unwrap();
    assert_eq!(e.query_status().unwrap(), SyncStatus::Ready);
}

#[test]
fn event_index_in_use_is_refused_until_the_event_is_dropped() {
    if common::skip() {
        return;
    }
    let (_rt, _dev, ctx) = setup();
    let p = ctx.create_event_pool(2).unwrap();
    let e = p.create_event(1).unwrap();
    assert_eq!(code(p.create_event(1)), INVALID_ARGUMENT);
    assert!(msg(p.create_event(1)).contains("already in use"));
    assert_eq!(p.used(), 1);
    let clone = e.clone();
    drop(e);
    // A clone is the same event: the index stays taken.
    assert_eq!(code(p.create_event(1)), INVALID_ARGUMENT);
    drop(clone);
    assert_eq!(p.used(), 0);
    assert!(p.create_event(1).is_ok());
}

#[test]
fn fence_created_signaled_is_ready_until_reset() {
    if common::skip() {
        return;
    }
    let (_rt, dev, ctx) = setup();
    let q = ctx.create_command_queue(&dev).unwrap();
    let f = q.create_fence(true).unwrap();
    assert_eq!(f.query_status().unwrap(), SyncStatus::Ready);
    assert_eq!(f.host_synchronize(0).unwrap(), SyncStatus::Ready);
    f.reset().unwrap();
    assert_eq!(f.query_status().unwrap(), SyncStatus::NotReady);
    let g = q.create_fence(false).unwrap();
    assert_eq!(g.query_status().unwrap(), SyncStatus::NotReady);
}

#[test]
fn memory_advice_past_9_is_invalid_enumeration() {
    if common::skip() {
        return;
    }
    for v in 0..=9 {
        assert_eq!(MemoryAdvice::from_raw(v).unwrap().raw(), v);
    }
    assert_eq!(code(MemoryAdvice::from_raw(10)), INVALID_ENUMERATION);
    assert!(msg(MemoryAdvice::from_raw(10)).contains("advice 10"));
}

#[test]
fn system_memory_import_size_must_match_call_size() {
    if common::skip() {
        return;
    }
    let (rt, _dev, ctx) = setup();
    let page = 4096;
    let layout = std::alloc::Layout::from_size_align(4 * page, page).unwrap();
    // SAFETY: a non-zero layout.
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as usize;
    let bad = AllocDesc::new(page).system_memory_sized(p, 2 * page as u64, false);
    assert_eq!(code(ctx.alloc_host(&bad)), INVALID_ARGUMENT);
    assert!(msg(ctx.alloc_host(&bad)).contains("0x2000"));
    // Nothing was imported.
    assert_eq!(rt.driver().usm_stats().imports, 0);
    let good = AllocDesc::new(page).system_memory_sized(p, page as u64, false);
    assert_eq!(ctx.alloc_host(&good).unwrap(), p);
    assert_eq!(rt.driver().usm_stats().imports, 1);
    ctx.free_memory(p).unwrap();
    // SAFETY: allocated above with this layout; the import is released.
    unsafe { std::alloc::dealloc(p as *mut u8, layout) };
}

#[test]
fn flag_sets_refuse_bits_outside_their_enum() {
    if common::skip() {
        return;
    }
    let sets = [
        (FlagSet::Init, 0x3),
        (FlagSet::Context, 0x1),
        (FlagSet::HostAlloc, 0x1f),
        (FlagSet::DeviceAlloc, 0x7),
        (FlagSet::CommandQueue, 0x3),
        (FlagSet::CommandList, 0x1f),
        (FlagSet::EventPool, 0xf),
        (FlagSet::EventScope, 0x7),
        (FlagSet::Fence, 0x1),
    ];
    for (set, all) in sets {
        assert_eq!(set.check(all).unwrap(), all);
        assert_eq!(code(set.check(all + 1)), INVALID_ENUMERATION, "{set:?}");
        assert!(msg(set.check(1 << 31)).contains(set.name()));
    }
}

#[test]
fn physical_memory_properties_of_another_context_is_invalid_argument() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let other = rt.driver().create_context().unwrap();
    let page = ctx.query_page_size(&dev, MIB).unwrap();
    let phys = ctx
        .create_physical_memory(Some(&dev), PhysicalMemoryFlags::AllocateOnDevice, page)
        .unwrap();
    let props = ctx.physical_memory_properties(&phys).unwrap();
    assert_eq!((props.id, props.size), (phys.id, page));
    assert_eq!(
        code(other.physical_memory_properties(&phys)),
        INVALID_ARGUMENT
    );
    ctx.destroy_physical_memory(phys).unwrap();
    assert_eq!(
        code(ctx.physical_memory_properties(&phys)),
        INVALID_ARGUMENT
    );
}

#[test]
fn objects_of_another_context_are_invalid_argument() {
    if common::skip() {
        return;
    }
    let (rt, dev, ctx) = setup();
    let other = rt.driver().create_context().unwrap();
    let q = ctx.create_command_queue(&dev).unwrap();
    let l = ctx.create_command_list(&dev).unwrap();
    let foreign_ev = other.create_event_pool(1).unwrap().create_event(0).unwrap();
    let foreign_plain = other.create_event().unwrap();
    let src = ctx.alloc_host(&AllocDesc::new(4096)).unwrap();
    let dst = ctx.alloc_host(&AllocDesc::new(4096)).unwrap();
    for e in [&foreign_ev, &foreign_plain] {
        assert_eq!(code(l.append_signal_event(e)), INVALID_ARGUMENT);
        assert_eq!(code(l.append_wait_on_events(&[e])), INVALID_ARGUMENT);
        assert_eq!(code(l.append_barrier(Some(e), &[])), INVALID_ARGUMENT);
        assert_eq!(
            code(l.append_memory_copy(dst, src, 16, None, &[e])),
            INVALID_ARGUMENT
        );
        assert_eq!(
            code(l.append_memory_fill(dst, &[1], 16, Some(e), &[])),
            INVALID_ARGUMENT
        );
    }
    assert!(msg(l.append_signal_event(&foreign_ev)).contains("signal event"));
    // Nothing was appended: the list executes as empty, and the foreign events stay unsignalled.
    l.close().unwrap();
    q.execute_command_lists(&[&l], None).unwrap();
    assert_eq!(q.synchronize(u64::MAX).unwrap(), SyncStatus::Ready);
    assert_eq!(foreign_ev.query_status().unwrap(), SyncStatus::NotReady);
    // A list of another context is not executed.
    let fl = other.create_command_list(&dev).unwrap();
    fl.close().unwrap();
    assert_eq!(
        code(q.execute_command_lists(&[&fl], None)),
        INVALID_ARGUMENT
    );
    assert!(msg(q.execute_command_lists(&[&l, &fl], None)).contains("command list 1"));
    // Events of the same context are fine.
    let mine = ctx.create_event().unwrap();
    let l2 = ctx.create_command_list(&dev).unwrap();
    l2.append_signal_event(&mine).unwrap();
}
