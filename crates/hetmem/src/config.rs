//! Configuration of a runtime: which backend, with that backend's own settings. Plain data
//! (no platform calls beyond reading the machine's RAM for the host default), shared by the API
//! (`RuntimeBuilder`, `Driver::config`) and the semantics layer.

use crate::error::{Error, Result};

/// Which backend a driver runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Any Linux machine: virtual devices over mmap / memfd / mprotect.
    Host,
    /// NVIDIA GPUs through the CUDA driver API.
    Cuda,
}

impl BackendKind {
    /// Parses `host` or `cuda` (as in `HETMEM_BACKEND`).
    pub fn parse(s: &str) -> Result<BackendKind> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "host" => Ok(BackendKind::Host),
            "cuda" => Ok(BackendKind::Cuda),
            other => Err(Error::InvalidArgument(format!(
                "backend {other:?} is not one of: host, cuda"
            ))),
        }
    }

    /// `host` or `cuda`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// Parses a byte count with an optional binary suffix: `1073741824`, `512M`, `4G`, `1T`, `64K`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_uppercase();
            let m = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1u64,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "size {s:?} has an unknown unit"
                    )))
                }
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| Error::InvalidArgument(format!("size {s:?} is not a number of bytes")))?;
    n.checked_mul(mult)
        .ok_or_else(|| Error::InvalidArgument(format!("size {s:?} overflows 64 bits")))
}

/// Settings of the host backend's virtual devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Number of virtual devices (at least 1).
    pub devices: u32,
    /// Capacity of each device, in bytes.
    pub device_memory: u64,
    /// Largest single allocation on each device, in bytes (at most `device_memory`).
    pub max_alloc_size: u64,
    /// The settings the runtime did not take as given, in the order it changed them (empty
    /// when every value is in force as asked): for `hetmem info`, warnings and any front
    /// that reports the configuration.
    pub adjustments: Vec<Adjustment>,
    /// Take 2 MiB pages where the machine offers them (shmem THP for physical objects,
    /// reserved hugetlbfs pages for managed memory); false: 4 KiB pages only
    /// (`HETMEM_HOST_HUGE_PAGES=off`). Default true.
    pub huge_pages: bool,
    /// Sub-devices of each device (`HETMEM_HOST_SUBDEVICES`, 0 or 2 to 16; default 0, none):
    /// each a share of its device's capacity with its own queues (see
    /// `hetmem::semantics`' capacity model and `zeDeviceGetSubDevices`).
    pub sub_devices: u32,
}

/// A configuration value the runtime changed instead of taking it as given: which setting,
/// what was asked, what is in force, and why. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adjustment {
    /// The setting as it was given: `HETMEM_HOST_MAX_ALLOC=10G` from the environment, or the
    /// builder call, `host_max_alloc_size(10737418240)`.
    pub setting: String,
    /// The field of [`HostConfig`] it changed (`max_alloc_size`, `device_memory`).
    pub field: &'static str,
    /// The value asked for (or, for a derived value, what the rule gave before the limit).
    pub asked: u64,
    /// The value in force.
    pub used: u64,
    /// Why, e.g. `more than a device's memory (1073741824 bytes)`.
    pub reason: String,
}

impl std::fmt::Display for Adjustment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} {} bytes is {}; using {} bytes",
            self.setting, self.field, self.asked, self.reason, self.used
        )
    }
}

impl HostConfig {
    /// Default: 2 devices sharing a quarter of the machine's RAM (each a multiple of 2 MiB, at
    /// least 64 MiB); the largest single allocation is half a device's capacity.
    pub fn default_for_machine() -> HostConfig {
        let round = |v: u64| v / (2 << 20) * (2 << 20);
        let devices = 2;
        let ram = crate::backend::platform_facts().total_ram;
        let device_memory = round(ram / 4 / devices as u64).max(64 << 20);
        HostConfig {
            devices,
            device_memory,
            max_alloc_size: round(device_memory / 2).max(2 << 20),
            adjustments: Vec::new(),
            huge_pages: true,
            sub_devices: 0,
        }
    }
}

/// The backend a driver runs on, with that backend's own settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendConfig {
    /// The host backend and its virtual devices.
    Host(HostConfig),
    /// The cuda backend (devices are the GPUs the CUDA driver reports).
    Cuda,
}

impl BackendConfig {
    /// Which backend.
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendConfig::Host(_) => BackendKind::Host,
            BackendConfig::Cuda => BackendKind::Cuda,
        }
    }

    /// Sub-devices of each device: the host backend's setting; none on cuda (a GPU has no
    /// Level Zero sub-devices, see `Driver::sub_devices_note`).
    pub fn sub_devices(&self) -> u32 {
        match self {
            BackendConfig::Host(h) => h.sub_devices,
            BackendConfig::Cuda => 0,
        }
    }
}
