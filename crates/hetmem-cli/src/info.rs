//! `hetmem info`.

/// Arguments of `hetmem info`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backend: host or cuda (default: $HETMEM_BACKEND, else host).
    #[arg(long)]
    backend: Option<String>,
}

/// A byte count in the largest binary unit that keeps it readable.
pub fn human(b: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (u, name) in UNITS {
        if b >= u {
            return if b.is_multiple_of(u) {
                format!("{} {name}", b / u)
            } else {
                format!("{:.1} {name}", b as f64 / u as f64)
            };
        }
    }
    format!("{b} B")
}

pub fn run(args: Args) -> Result<(), String> {
    let rt = crate::common::runtime_from_env(args.backend.as_deref())?;
    let drv = rt.driver();
    let ctx = drv.create_context().map_err(|e| e.to_string())?;
    println!("backend:  {}", drv.backend_kind().name());
    println!("driver:   {}", drv.describe());
    if let Some(k) = drv.page_kinds() {
        println!("pages:    {k}");
    }
    println!("devices:  {}", drv.devices().len());
    for d in drv.devices() {
        let i = d.info();
        let small = ctx.query_page_size(&d, 1).map_err(|e| e.to_string())?;
        let large = ctx
            .query_page_size(&d, 2 << 20)
            .map_err(|e| e.to_string())?;
        println!(
            "  [{}] {}: capacity {}, largest single allocation {}, page sizes {} (< 2 MiB) / {} (>= 2 MiB), granularity {} B",
            d.ordinal(),
            i.name,
            human(i.capacity),
            human(i.max_alloc_size),
            human(small as u64),
            human(large as u64),
            i.min_page_size
        );
        for s in d.sub_devices() {
            println!(
                "      sub-device {}: capacity {} (its share of device {}), largest single allocation {}, its own queues",
                s.sub_device_id().unwrap_or(0),
                human(s.capacity()),
                d.ordinal(),
                human(s.max_alloc_size()),
            );
        }
    }
    match drv.sub_devices_note() {
        Some(why) => println!("sub-devices: {why}"),
        None => match drv.sub_devices_per_device() {
            0 => println!("sub-devices: none (HETMEM_HOST_SUBDEVICES=N splits each device into N)"),
            n => println!("sub-devices: {n} per device"),
        },
    }
    let t = drv.ipc_handle_types();
    println!(
        "IPC handle types: {:#x} (DEFAULT{}; a fabric handle opens within this machine as a default one does, no fabric between machines)",
        t.raw(),
        if t.contains(hetmem::IpcHandleTypes::FABRIC_ACCESSIBLE) { ", FABRIC_ACCESSIBLE" } else { "" }
    );
    println!("configuration:");
    println!(
        "  HETMEM_BACKEND={}",
        std::env::var("HETMEM_BACKEND").unwrap_or_else(|_| "(unset: host)".into())
    );
    if let Some(c) = drv.host_config() {
        // A value the runtime changed says so on its line (and as a warning on stderr,
        // `common::runtime_from_env`).
        let adjusted = |var: &str, field: &str| -> String {
            c.adjustments
                .iter()
                .filter(|a| a.field == field)
                .map(|a| {
                    let by = if a.setting.starts_with(&format!("{var}=")) {
                        String::new()
                    } else {
                        format!(" by {}", a.setting)
                    };
                    format!("; adjusted{by} from {} bytes: {}", a.asked, a.reason)
                })
                .collect()
        };
        let env = |var: &str, unset: &str| std::env::var(var).unwrap_or_else(|_| unset.into());
        println!(
            "  HETMEM_HOST_DEVICES={} (env: {})",
            c.devices,
            env("HETMEM_HOST_DEVICES", "unset, default 2")
        );
        println!(
            "  HETMEM_HOST_DEVICE_MEMORY={} (env: {}{})",
            c.device_memory,
            env(
                "HETMEM_HOST_DEVICE_MEMORY",
                "unset, default a quarter of RAM split between devices"
            ),
            adjusted("HETMEM_HOST_DEVICE_MEMORY", "device_memory")
        );
        println!(
            "  HETMEM_HOST_MAX_ALLOC={} (env: {}{})",
            c.max_alloc_size,
            env("HETMEM_HOST_MAX_ALLOC", "unset, default half a device"),
            adjusted("HETMEM_HOST_MAX_ALLOC", "max_alloc_size")
        );
        println!(
            "  HETMEM_HOST_SUBDEVICES={} (env: {})",
            c.sub_devices,
            env("HETMEM_HOST_SUBDEVICES", "unset, default 0: no sub-devices")
        );
    }
    managed_info(&rt, &ctx);
    queue_memory_info(&rt, &ctx);
    println!("limits:");
    let facts = hetmem::platform::facts();
    println!("  host RAM: {}", human(facts.total_ram));
    println!("  OS page size: {} B", facts.page_size);
    println!(
        "  open files (RLIMIT_NOFILE soft limit in force): {}",
        facts
            .open_file_limit
            .map_or("unlimited".into(), |v| v.to_string())
    );
    println!(
        "  vm.max_map_count: {}",
        facts
            .max_map_count
            .map_or("unknown".into(), |v| v.to_string())
    );
    Ok(())
}

/// Plain system memory as a queue operand (Level Zero case 1) and host physical memory (case
/// 10): whether they work here (one host physical page is made, mapped and released).
fn queue_memory_info(rt: &hetmem::Runtime, ctx: &hetmem::Context) {
    let cuda = rt.driver().backend_kind() == hetmem::BackendKind::Cuda;
    println!(
        "system memory in queues: {} (Level Zero copies and fills take malloc'd / stack memory{})",
        if hetmem::queue::SYSTEM_MEMORY_IN_QUEUES {
            "yes"
        } else {
            "no"
        },
        if cuda {
            "; copies from 1 MiB staged through pinned buffers, fills written by the host"
        } else {
            ""
        }
    );
    let Some(dev) = rt.driver().device(0) else {
        return;
    };
    let probe = || -> hetmem::Result<usize> {
        let page = ctx.query_page_size(&dev, 1)?;
        let p =
            ctx.create_physical_memory(None, hetmem::PhysicalMemoryFlags::AllocateOnHost, page)?;
        let r = ctx.reserve(None, page);
        let mapped = r.as_ref().map_err(Clone::clone).and_then(|r| {
            ctx.map(r.base, page, p, 0, hetmem::AccessAttribute::ReadWrite)?;
            ctx.unmap(r.base, page)
        });
        if let Ok(r) = r {
            let _ = ctx.free_reservation(r);
        }
        let _ = ctx.destroy_physical_memory(p);
        mapped.map(|()| page)
    };
    match probe() {
        Ok(page) => println!(
            "host physical memory: available ({} pages{})",
            human(page as u64),
            if cuda {
                "; cuMemCreate at CU_MEM_LOCATION_TYPE_HOST_NUMA, the calling thread's node"
            } else {
                ""
            }
        ),
        Err(e) => println!("host physical memory: unavailable ({e})"),
    }
}

/// Managed memory: whether it works here (a 2 MiB allocation is made and freed) and the
/// driver's migration counters.
fn managed_info(rt: &hetmem::Runtime, ctx: &hetmem::Context) {
    match ctx.alloc_managed(1, hetmem::ACL_RT_MEM_ATTACH_GLOBAL) {
        Ok(p) => {
            let _ = ctx.free_managed(p);
            let how = match rt.driver().backend_kind() {
                hetmem::BackendKind::Host => "userfaultfd migration",
                hetmem::BackendKind::Cuda => "the CUDA driver's migration, cuMemAllocManaged",
            };
            println!(
                "managed memory: available ({how}, {} pages)",
                human(hetmem::MANAGED_PAGE_SIZE as u64)
            );
        }
        Err(e) => println!("managed memory: unavailable ({e})"),
    }
    let s = rt.driver().managed_stats();
    println!(
        "  counters: {} allocations, host faults {} ({} fault events), to host {} pages ({})",
        s.allocations,
        s.host_faults,
        s.fault_events,
        s.pages_to_host,
        human(s.bytes_to_host)
    );
    for (i, d) in s.devices.iter().enumerate() {
        println!(
            "  device {i}: to device {} pages ({}), from device {} pages ({}), evictions {}, resident {} pages",
            d.pages_to_device,
            human(d.bytes_to_device),
            d.pages_from_device,
            human(d.bytes_from_device),
            d.evictions,
            d.resident_pages
        );
    }
}
