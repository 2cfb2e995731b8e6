//! The argument rules of the ACL calls beyond the core families (2-D and batch copies,
//! 32-bit fills, host registration, value write / wait on a stream, event flags, the V2
//! shareable-handle types), so a Rust caller and the C library get the same answers. Each
//! function names the call and says which code each refusal is.

use crate::error::{Error, Result};

/// `aclrtMemcpy2d` / `aclrtMemcpy2dAsync`: `height` rows of `width` bytes, rows `dpitch` /
/// `spitch` bytes apart. Returns the `(dst offset, src offset)` of each row.
///
/// Errors: `InvalidSize` (100000) for width or height 0, or a width over either pitch;
/// `InvalidArgument` (107000) for a span that overflows the address space.
pub fn rows_2d(
    dpitch: usize,
    spitch: usize,
    width: usize,
    height: usize,
) -> Result<Vec<(usize, usize)>> {
    if width == 0 || height == 0 {
        return Err(Error::InvalidSize(format!(
            "width {width} and height {height} must both be non-zero"
        )));
    }
    if width > dpitch || width > spitch {
        return Err(Error::InvalidSize(format!(
            "width {width} is over dpitch {dpitch} or spitch {spitch}"
        )));
    }
    let span = |pitch: usize| {
        pitch
            .checked_mul(height - 1)
            .and_then(|s| s.checked_add(width))
    };
    if span(dpitch).is_none() || span(spitch).is_none() {
        return Err(Error::InvalidArgument(format!(
            "{height} rows of pitch {dpitch} / {spitch} overflow the address space"
        )));
    }
    Ok((0..height).map(|r| (r * dpitch, r * spitch)).collect())
}

/// `aclrtMemcpyBatch*`: `numBatches` copies with `numAttrs` attribute ranges whose first
/// indexes `attrs_indexes` start at 0 and increase, each below `numBatches`.
///
/// Errors: `InvalidSize` (100000) for 0 copies or 0 attributes, or more attributes than
/// copies; `InvalidArgument` (107000) for indexes that do not start at 0, do not increase or
/// run past the copies.
pub fn check_batch(num_batches: usize, attrs_indexes: &[usize]) -> Result<()> {
    if num_batches == 0 || attrs_indexes.is_empty() || attrs_indexes.len() > num_batches {
        return Err(Error::InvalidSize(format!(
            "numBatches {num_batches} and numAttrs {} must be non-zero, numAttrs at most \
             numBatches",
            attrs_indexes.len()
        )));
    }
    if attrs_indexes[0] != 0 {
        return Err(Error::InvalidArgument(format!(
            "attrsIndexes[0] is {}, not 0",
            attrs_indexes[0]
        )));
    }
    for (i, w) in attrs_indexes.windows(2).enumerate() {
        if w[1] <= w[0] || w[1] >= num_batches {
            return Err(Error::InvalidArgument(format!(
                "attrsIndexes[{}] = {} does not increase or is not below numBatches \
                 {num_batches}",
                i + 1,
                w[1]
            )));
        }
    }
    Ok(())
}

/// `aclrtMemsetD32` / `aclrtMemsetD32Async`: `n` 32-bit values into a buffer of `mem_size`
/// bytes; returns the bytes filled.
///
/// Errors: `InvalidSize` (100000) for 0 values or `n * 4` over `mem_size` (or overflowing).
pub fn d32_bytes(mem_size: usize, n: usize) -> Result<usize> {
    match n.checked_mul(4) {
        Some(b) if n > 0 && b <= mem_size => Ok(b),
        _ => Err(Error::InvalidSize(format!(
            "N {n} 32-bit values do not fit memSize {mem_size} bytes (or N is 0)"
        ))),
    }
}

/// `aclrtHostRegisterType` / `aclrtHostRegisterV2` flags decoded: whether the registered
/// memory is read-only for devices.
///
/// `aclrtHostRegister`'s type: MAPPED (0) or READONLY (8); IOMEMORY (4) is
/// `UnsupportedFeature` (207000: memory of a device's BAR is not host memory hetmem imports);
/// any other value `UnsupportedEnumeration` (107000).
pub fn host_register_type(ty: u32) -> Result<bool> {
    match ty {
        0 => Ok(false),
        8 => Ok(true),
        4 => Err(Error::UnsupportedFeature(
            "ACL_HOST_REGISTER_IOMEMORY: I/O memory is not host memory hetmem can import".into(),
        )),
        t => Err(Error::UnsupportedEnumeration(format!(
            "type {t} is not an aclrtHostRegisterType (MAPPED 0, IOMEMORY 4, READONLY 8)"
        ))),
    }
}

/// `aclrtHostRegisterV2` flags: MAPPED (0x2), READONLY (0x8) and PINNED (0x10000000) in any
/// combination (every registration is mapped and pinned here); IOMEMORY (0x4) is
/// `UnsupportedFeature` (207000); other bits `InvalidEnumeration` (100000). Returns whether
/// the memory is read-only for devices.
pub fn host_register_flags(flags: u32) -> Result<bool> {
    const KNOWN: u32 = 0x2 | 0x4 | 0x8 | 0x1000_0000;
    if flags & !KNOWN != 0 {
        return Err(Error::InvalidEnumeration(format!(
            "flag {flags:#x} has bits that are not ACL_HOST_REG_MAPPED (0x2), IOMEMORY (0x4), \
             READONLY (0x8) or PINNED (0x10000000)"
        )));
    }
    if flags & 0x4 != 0 {
        return host_register_type(4);
    }
    Ok(flags & 0x8 != 0)
}

/// `aclrtValueWait`'s flag: GEQ (0), EQ (1), AND (2), NOR (3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueWait {
    /// `ACL_STREAM_WAIT_VALUE_GEQ`: `*addr >= value`.
    Geq,
    /// `ACL_STREAM_WAIT_VALUE_EQ`: `*addr == value`.
    Eq,
    /// `ACL_STREAM_WAIT_VALUE_AND`: `*addr & value != 0`.
    And,
    /// `ACL_STREAM_WAIT_VALUE_NOR`: `!(*addr | value) != 0`.
    Nor,
}

impl ValueWait {
    /// Decodes the flag.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for another value.
    pub fn from_raw(flag: u32) -> Result<ValueWait> {
        Ok(match flag {
            0 => ValueWait::Geq,
            1 => ValueWait::Eq,
            2 => ValueWait::And,
            3 => ValueWait::Nor,
            f => {
                return Err(Error::UnsupportedEnumeration(format!(
                    "flag {f} is not ACL_STREAM_WAIT_VALUE_GEQ (0), EQ (1), AND (2) or NOR (3)"
                )))
            }
        })
    }

    /// Whether the 64-bit value `current` read at the address satisfies the wait for `value`.
    pub fn satisfied(self, current: u64, value: u64) -> bool {
        match self {
            ValueWait::Geq => current >= value,
            ValueWait::Eq => current == value,
            ValueWait::And => current & value != 0,
            ValueWait::Nor => !(current | value) != 0,
        }
    }
}

/// `aclrtValueWrite`'s flag: reserved, 0. The address of both calls: 8-byte aligned.
///
/// Errors: `InvalidEnumeration` (100000) for another flag; `UnsupportedAlignment` (107000) for
/// an address that is not 8-byte aligned.
pub fn check_value_args(addr: usize, write_flag: Option<u32>) -> Result<()> {
    if let Some(f) = write_flag.filter(|&f| f != 0) {
        return Err(Error::InvalidEnumeration(format!(
            "flag {f} of aclrtValueWrite is reserved and must be 0"
        )));
    }
    if !addr.is_multiple_of(8) {
        return Err(Error::UnsupportedAlignment(format!(
            "devAddr {addr:#x} is not 8-byte aligned (a 64-bit value)"
        )));
    }
    Ok(())
}

/// `aclrtCreateEventWithFlag` / `aclrtCreateEventExWithFlag` flags: SYNC (0x1),
/// CAPTURE_STREAM_PROGRESS (0x2), TIME_LINE (0x8), DEVICE_USE_ONLY (0x10) and EXTERNAL (0x20)
/// make the same event here; IPC (0x40) is `UnsupportedFeature` (207000: events are not shared
/// between processes); other bits `InvalidEnumeration` (100000).
pub fn check_event_flags(flag: u32) -> Result<()> {
    const KNOWN: u32 = 0x1 | 0x2 | 0x8 | 0x10 | 0x20 | 0x40;
    if flag & !KNOWN != 0 {
        return Err(Error::InvalidEnumeration(format!(
            "flag {flag:#x} has bits that are not ACL_EVENT_* flags"
        )));
    }
    if flag & 0x40 != 0 {
        return Err(Error::UnsupportedFeature(
            "ACL_EVENT_IPC: hetmem's events are not shared between processes".into(),
        ));
    }
    Ok(())
}

/// `aclrtMemSharedHandleType` of the V2 shareable-handle calls: DEFAULT (0x1, a `uint64_t`)
/// or FABRIC (0x2, a 128-byte `aclrtMemFabricHandle`; here within one machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedHandleType {
    /// `ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT`.
    Default,
    /// `ACL_MEM_SHARE_HANDLE_TYPE_FABRIC`.
    Fabric,
}

impl SharedHandleType {
    /// Decodes the type.
    ///
    /// Errors: `UnsupportedEnumeration` (107000) for another value.
    pub fn from_raw(t: u32) -> Result<SharedHandleType> {
        match t {
            1 => Ok(SharedHandleType::Default),
            2 => Ok(SharedHandleType::Fabric),
            t => Err(Error::UnsupportedEnumeration(format!(
                "shareType {t} is not ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT (1) or FABRIC (2)"
            ))),
        }
    }
}

/// The 128-byte fabric handle: `"HMFABRIC"`, the 64-bit shareable handle, then zeros.
pub fn fabric_bytes(shareable: u64) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[..8].copy_from_slice(b"HMFABRIC");
    b[8..16].copy_from_slice(&shareable.to_le_bytes());
    b
}

/// The shareable handle a fabric handle carries.
///
/// Errors: `InvalidArgument` (107000) for bytes that are not one.
pub fn fabric_shareable(b: &[u8; 128]) -> Result<u64> {
    if &b[..8] != b"HMFABRIC" || b[16..].iter().any(|&x| x != 0) {
        return Err(Error::InvalidArgument(
            "the aclrtMemFabricHandle was not made by aclrtMemExportToShareableHandleV2".into(),
        ));
    }
    Ok(u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")))
}
