//! `hetmem bench <group>`: each hetmem operation next to the bare syscalls (or driver calls) it
//! needs, measured in the same run, interleaved round by round, reported as medians and ratios.
//!
//! Ratio convention (every group): a field ending in `_ratio` names the operation and size; for a
//! latency it is hetmem's time over the baseline's (lower is better, 1.0 = no overhead); for a
//! bandwidth it is hetmem's bandwidth over the baseline's (higher is better).
//!
//! Each group lives in its own submodule and returns its rows.

mod acl;
mod acl_vmm;
mod cuda;
mod ipc;
mod kv;
mod managed;
mod usm;
mod vmm;
mod ze;

use std::os::fd::OwnedFd;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Arguments of `hetmem bench`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Benchmark group: vmm, usm, ipc, managed, kv, ze, acl, cuda (needs an NVIDIA GPU).
    pub group: String,
    /// Write every figure of the group to this JSON file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Operations per round and size.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true, value_parser = crate::args::count::<usize>(1, 10_000_000))]
    pub iters: usize,
    /// Rounds (hetmem and baseline alternate; the median round counts).
    #[arg(long, default_value_t = 7, allow_negative_numbers = true, value_parser = crate::args::count::<usize>(1, 10_000))]
    pub rounds: usize,
    /// Live mappings during the get-access measurement (vmm).
    #[arg(long, default_value_t = 50_000, allow_negative_numbers = true, value_parser = crate::args::count::<usize>(0, 10_000_000))]
    pub live_mappings: usize,
}

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Nanoseconds per operation (lower is better).
    Ns,
    /// Bandwidth in GiB/s (higher is better).
    GiBps,
}

impl Unit {
    fn suffix(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::GiBps => "gibps",
        }
    }
}

/// One row of the table: an operation at a size, hetmem vs its baseline measured in the same
/// run. The ratio is always hetmem's figure over the baseline's (for latencies lower is better,
/// for bandwidths higher is better).
pub struct Row {
    pub op: &'static str,
    pub size: &'static str,
    pub key: String,
    pub unit: Unit,
    pub hetmem_ns: f64,
    pub baseline_ns: Option<f64>,
    pub baseline: &'static str,
    pub target: Option<&'static str>,
}

/// JSON fields a group adds beyond its rows' (e.g. a speedup that is baseline / hetmem, or a
/// figure with its own name), written by `run` after the rows' fields.
static EXTRA_JSON: std::sync::Mutex<Vec<(String, f64)>> = std::sync::Mutex::new(Vec::new());

/// Adds the JSON field `key` (written as is) with value `v` to this run's output.
pub fn json_extra(key: &str, v: f64) {
    EXTRA_JSON
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((key.to_string(), v));
}

/// Every benchmark group `run` knows (the error for an unknown one lists them).
/// Leaks a row label made at run time (a few per run).
pub fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The 2 MiB page kind of physical objects on a host runtime that takes huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugeKind {
    /// Reserved hugetlbfs pages (`vm.nr_hugepages`).
    Hugetlb,
    /// Shmem THP folios.
    Thp,
}

impl HugeKind {
    /// The suffix of the JSON keys of its rows.
    pub fn key_suffix(self) -> &'static str {
        match self {
            HugeKind::Hugetlb => "_hugetlb",
            HugeKind::Thp => "_huge",
        }
    }

    /// The mark of its rows in the table.
    pub fn mark(self) -> &'static str {
        match self {
            HugeKind::Hugetlb => "2M hugetlb",
            HugeKind::Thp => "2M",
        }
    }
}

/// The 2 MiB page kind the physical objects of a group's 2 MiB rows get, for `pages` objects of
/// 2 MiB on each side (hetmem's and the raw sequence's): hugetlbfs where the machine has
/// reserved 2 MiB pages and `2 * pages` of them are free (the runtime takes them first), shmem
/// THP where none are reserved and shmem THP is on; `Err` says why neither.
pub fn physical_huge_kind(pages: u64) -> Result<HugeKind, String> {
    let read = |f: &str| -> u64 {
        std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{f}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let (total, free) = (read("nr_hugepages"), read("free_hugepages"));
    if total == 0 {
        return huge_pages_available(None).map(|()| HugeKind::Thp);
    }
    if free >= 2 * pages {
        Ok(HugeKind::Hugetlb)
    } else {
        Err(format!(
            "{free} of {total} reserved 2 MiB pages are free, the rows need {} (as root: sysctl \
             vm.nr_hugepages={}, or 0 for shmem THP rows)",
            2 * pages,
            total - free + 2 * pages + 16
        ))
    }
}

/// A hugetlbfs memfd of `size` bytes (a 2 MiB multiple) with its pages allocated and the seals
/// of hetmem's objects: `memfd_create(MFD_HUGETLB | MFD_HUGE_2MB | MFD_ALLOW_SEALING)`,
/// `ftruncate`, `fallocate`, `F_ADD_SEALS` (the host backend's hugetlbfs physical object).
pub fn raw_hugetlb_memfd(size: usize) -> Result<OwnedFd, String> {
    let fd = rustix::fs::memfd_create(
        "bench-huge",
        MemfdFlags::CLOEXEC
            | MemfdFlags::ALLOW_SEALING
            | MemfdFlags::HUGETLB
            | MemfdFlags::HUGE_2MB,
    )
    .map_err(|e| format!("memfd_create(MFD_HUGETLB): {e}"))?;
    rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
    rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, size as u64)
        .map_err(|e| format!("fallocate of a hugetlbfs memfd: {e}"))?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
        .map_err(|e| e.to_string())?;
    Ok(fd)
}

/// Free reserved 2 MiB pages now.
pub fn hugetlb_free() -> u64 {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The machine's 2 MiB pages for the rows of both page kinds: `Err` says why a group's 2 MiB
/// rows cannot run here. `hugetlb_pages`: reserved 2 MiB pages the group needs free
/// (managed memory); else shmem THP must be enabled for 2 MiB (physical objects).
pub fn huge_pages_available(hugetlb_pages: Option<u64>) -> Result<(), String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    match hugetlb_pages {
        Some(need) => {
            let free: u64 = read("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
                .trim()
                .parse()
                .unwrap_or(0);
            if free >= need {
                Ok(())
            } else {
                Err(format!(
                    "{free} reserved 2 MiB pages are free, the group needs {need} \
                     (vm.nr_hugepages; as root: sysctl vm.nr_hugepages={})",
                    need + 16
                ))
            }
        }
        None => {
            let sel = |s: String| {
                let (a, b) = (s.find('[')?, s.find(']')?);
                Some(s[a + 1..b].to_string())
            };
            let thp = "/sys/kernel/mm/transparent_hugepage";
            let mode = match sel(read(&format!("{thp}/hugepages-2048kB/shmem_enabled"))) {
                Some(m) if m != "inherit" => Some(m),
                _ => sel(read(&format!("{thp}/shmem_enabled"))),
            }
            .unwrap_or_else(|| "unknown".into());
            if matches!(mode.as_str(), "always" | "within_size" | "advise" | "force") {
                Ok(())
            } else {
                Err(format!(
                    "shmem THP for 2 MiB is {mode} (as root: echo advise > \
                     {thp}/shmem_enabled)"
                ))
            }
        }
    }
}

pub const GROUPS: [&str; 8] = ["vmm", "usm", "ipc", "managed", "kv", "ze", "acl", "cuda"];

pub fn run(args: Args) -> Result<(), String> {
    // Before the group runs (minutes for some), not when its figures are ready.
    crate::args::check_outputs(&[("--json", args.json.as_deref())])?;
    let rows = match args.group.as_str() {
        "vmm" => vmm::bench(&args)?,
        "usm" => usm::bench(&args)?,
        "ipc" => ipc::bench(&args)?,
        "managed" => managed::bench(&args)?,
        "kv" => kv::bench(&args)?,
        "ze" => ze::bench(&args)?,
        "acl" => acl::bench(&args)?,
        "cuda" => cuda::bench(&args)?,
        // The importer process of `ipc` (re-executed by it; not a group of its own).
        "ipc-importer" => return ipc::importer().map(|_| ()),
        other => {
            return Err(format!(
                "unknown benchmark group {other:?}; groups: {}",
                GROUPS.join(", ")
            ))
        }
    };
    print_table(&args.group, &rows);
    if let Some(path) = &args.json {
        let mut obj = serde_json::Map::new();
        obj.insert("group".into(), args.group.clone().into());
        obj.insert("iters".into(), args.iters.into());
        obj.insert("rounds".into(), args.rounds.into());
        for r in &rows {
            let unit = r.unit.suffix();
            obj.insert(format!("{}_{unit}", r.key), r.hetmem_ns.into());
            if let Some(b) = r.baseline_ns {
                obj.insert(format!("{}_baseline_{unit}", r.key), b.into());
                obj.insert(format!("{}_ratio", r.key), (r.hetmem_ns / b).into());
            }
        }
        for (k, v) in EXTRA_JSON.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            obj.insert(k.clone(), (*v).into());
        }
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(obj))
            .map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_table(group: &str, rows: &[Row]) {
    println!(
        "hetmem bench {group} (median of rounds; unit ns = per operation, gibps = GiB/s; \
         ratio = hetmem / baseline)"
    );
    println!(
        "{:<22} {:>7} {:>6} {:>12} {:>12} {:>7}  {:<44} target",
        "operation", "size", "unit", "hetmem", "baseline", "ratio", "baseline is"
    );
    for r in rows {
        let (b, ratio) = match r.baseline_ns {
            Some(b) => (fmt_value(b), format!("{:.2}", r.hetmem_ns / b)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<22} {:>7} {:>6} {:>12} {:>12} {:>7}  {:<44} {}",
            r.op,
            r.size,
            r.unit.suffix(),
            fmt_value(r.hetmem_ns),
            b,
            ratio,
            r.baseline,
            r.target.unwrap_or("")
        );
    }
}

fn fmt_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `hetmem_round` and `baseline_round` alternately `rounds` times; each returns the ns per
/// operation of one round. Returns the medians.
pub fn alternate(
    rounds: usize,
    mut hetmem_round: impl FnMut() -> Result<f64, String>,
    mut baseline_round: impl FnMut() -> Result<f64, String>,
) -> Result<(f64, f64), String> {
    let (mut h, mut b) = (Vec::new(), Vec::new());
    // One warm-up round of each, not counted.
    hetmem_round()?;
    baseline_round()?;
    // Alternate which side goes first, so that work the kernel defers (RCU frees of VMAs,
    // page-table teardown) is charged to both sides alike.
    for r in 0..rounds {
        if r % 2 == 0 {
            h.push(hetmem_round()?);
            b.push(baseline_round()?);
        } else {
            b.push(baseline_round()?);
            h.push(hetmem_round()?);
        }
    }
    Ok((median(h), median(b)))
}

pub use crate::common::e2s;

pub fn raw_memfd(size: usize) -> Result<OwnedFd, String> {
    let fd = rustix::fs::memfd_create("bench", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| e.to_string())?;
    rustix::fs::ftruncate(&fd, size as u64).map_err(|e| e.to_string())?;
    rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)
        .map_err(|e| e.to_string())?;
    Ok(fd)
}

/// A raw reservation for the baselines: `mmap(PROT_NONE)` aligned to `align`.
pub fn raw_reserve(size: usize, align: usize) -> Result<usize, String> {
    // SAFETY: a fresh anonymous mapping; the slack is unmapped at once.
    unsafe {
        let p = rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            size + align,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
        .map_err(|e| e.to_string())? as usize;
        let start = (p + align - 1) & !(align - 1);
        if start > p {
            rustix::mm::munmap(p as *mut _, start - p).map_err(|e| e.to_string())?;
        }
        let tail = p + size + align - (start + size);
        if tail > 0 {
            rustix::mm::munmap((start + size) as *mut _, tail).map_err(|e| e.to_string())?;
        }
        Ok(start)
    }
}

pub fn raw_release(addr: usize, size: usize) {
    // SAFETY: a raw reservation of ours.
    unsafe { rustix::mm::munmap(addr as *mut _, size).ok() };
}

pub fn size_name(s: usize) -> &'static str {
    match s {
        0x10000 => "64KiB",
        0x200000 => "2MiB",
        _ => "?",
    }
}

pub fn key(op: &str, s: usize) -> String {
    format!("{op}_{}", size_name(s).to_ascii_lowercase())
}
