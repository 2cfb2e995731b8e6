//! The argument rules of queues, lists and events (`ze_command_queue_desc_t`,
//! `ze_command_list_desc_t`, fill patterns of `zeCommandListAppendMemoryFill`, event pool counts
//! and indices of `zeEventPoolCreate` / `zeEventCreate`, the one-context rule), each choosing its
//! spec code once.

use crate::error::{Error, Result};

/// The largest fill pattern in bytes (`maxMemoryFillPatternSize` of
/// `ze_command_queue_group_properties_t`).
pub const MAX_FILL_PATTERN_SIZE: usize = 128;

/// The fill pattern rule: 1 to [`MAX_FILL_PATTERN_SIZE`] bytes, a power of two.
///
/// Errors: `InvalidSize` naming the length.
pub(crate) fn check_pattern(pattern: &[u8]) -> Result<()> {
    let n = pattern.len();
    if n == 0 || n > MAX_FILL_PATTERN_SIZE || !n.is_power_of_two() {
        return Err(Error::InvalidSize(format!(
            "fill pattern of {n} bytes is not a power of two from 1 to {MAX_FILL_PATTERN_SIZE}"
        )));
    }
    Ok(())
}

/// Queues in the device's one command queue group (`numQueues` of
/// `ze_command_queue_group_properties_t`).
pub const QUEUES_PER_GROUP: u32 = 64;

/// `ze_command_queue_mode_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueMode {
    /// DEFAULT (0): asynchronous here.
    #[default]
    Default = 0,
    /// SYNCHRONOUS (1): each execute (and each append of an immediate list) waits for its work.
    Synchronous = 1,
    /// ASYNCHRONOUS (2).
    Asynchronous = 2,
}

/// `ze_command_queue_priority_t` (recorded; every queue runs alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueuePriority {
    /// NORMAL (0).
    #[default]
    Normal = 0,
    /// PRIORITY_LOW (1).
    Low = 1,
    /// PRIORITY_HIGH (2).
    High = 2,
}

/// `ze_command_queue_desc_t` (`zeCommandQueueCreate`, and the `altdesc` of
/// `zeCommandListCreateImmediate`).
///
/// ```
/// # use hetmem::queue::{CommandQueueDesc, QueueMode};
/// let d = CommandQueueDesc::from_raw(0, 3, 0, 1, 0).unwrap();
/// assert_eq!(d.mode, QueueMode::Synchronous);
/// assert!(CommandQueueDesc::from_raw(1, 0, 0, 0, 0).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandQueueDesc {
    /// The command queue group ordinal: the device has one group, 0.
    pub ordinal: u32,
    /// The queue index in the group: below [`QUEUES_PER_GROUP`].
    pub index: u32,
    /// `ze_command_queue_flags_t`.
    pub flags: u32,
    /// The mode.
    pub mode: QueueMode,
    /// The priority.
    pub priority: QueuePriority,
}

impl CommandQueueDesc {
    /// Decodes the C fields and checks them ([`CommandQueueDesc::check`]).
    ///
    /// Errors: `InvalidEnumeration` for flags outside `ze_command_queue_flags_t`, a mode past
    /// ASYNCHRONOUS (2) or a priority past HIGH (2); `InvalidArgument` for an ordinal other
    /// than 0 or an index of [`QUEUES_PER_GROUP`] or more. Each names the value.
    pub fn from_raw(
        ordinal: u32,
        index: u32,
        flags: u32,
        mode: u32,
        priority: u32,
    ) -> Result<CommandQueueDesc> {
        crate::spec::FlagSet::CommandQueue.check(flags)?;
        let mode = match mode {
            0 => QueueMode::Default,
            1 => QueueMode::Synchronous,
            2 => QueueMode::Asynchronous,
            m => {
                return Err(Error::InvalidEnumeration(format!(
                    "queue mode {m} is not DEFAULT, SYNCHRONOUS or ASYNCHRONOUS"
                )))
            }
        };
        let priority = match priority {
            0 => QueuePriority::Normal,
            1 => QueuePriority::Low,
            2 => QueuePriority::High,
            p => {
                return Err(Error::InvalidEnumeration(format!(
                    "queue priority {p} is not NORMAL, LOW or HIGH"
                )))
            }
        };
        let d = CommandQueueDesc {
            ordinal,
            index,
            flags,
            mode,
            priority,
        };
        d.check()?;
        Ok(d)
    }

    /// The group rule: ordinal 0 (the one group), index below [`QUEUES_PER_GROUP`]; flags
    /// within their set.
    ///
    /// Errors: as [`CommandQueueDesc::from_raw`].
    pub fn check(&self) -> Result<()> {
        crate::spec::FlagSet::CommandQueue.check(self.flags)?;
        if self.ordinal != 0 || self.index >= QUEUES_PER_GROUP {
            return Err(Error::InvalidArgument(format!(
                "queue group ordinal {} / index {}: the device has one group (ordinal 0) of \
                 {QUEUES_PER_GROUP} queues",
                self.ordinal, self.index
            )));
        }
        Ok(())
    }

    /// Whether the mode is SYNCHRONOUS.
    pub fn is_synchronous(&self) -> bool {
        self.mode == QueueMode::Synchronous
    }
}

/// `ze_command_list_desc_t` (`zeCommandListCreate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommandListDesc {
    /// `commandQueueGroupOrdinal`: the device has one group, 0.
    pub ordinal: u32,
    /// `ze_command_list_flags_t`.
    pub flags: u32,
}

impl CommandListDesc {
    /// Decodes and checks the C fields.
    ///
    /// Errors: `InvalidEnumeration` for flags outside `ze_command_list_flags_t`;
    /// `InvalidArgument` for an ordinal other than 0, naming it.
    pub fn from_raw(ordinal: u32, flags: u32) -> Result<CommandListDesc> {
        let d = CommandListDesc { ordinal, flags };
        d.check()?;
        Ok(d)
    }

    /// The rule of [`CommandListDesc::from_raw`].
    pub fn check(&self) -> Result<()> {
        crate::spec::FlagSet::CommandList.check(self.flags)?;
        if self.ordinal != 0 {
            return Err(Error::InvalidArgument(format!(
                "commandQueueGroupOrdinal {}: the device has one group (ordinal 0)",
                self.ordinal
            )));
        }
        Ok(())
    }
}

/// The event pool rules (`zeEventPoolCreate`): a pool has at least one event.
///
/// Errors: `InvalidSize` for a count of 0.
pub(crate) fn check_pool_count(count: u32) -> Result<()> {
    if count == 0 {
        return Err(Error::InvalidSize("event pool count is 0".into()));
    }
    Ok(())
}

/// Takes slot `index` of a pool of `count` events whose live slots are `used`
/// (`zeEventCreate`): the index is below the count and not taken by a live event.
///
/// Errors: `InvalidArgument` naming the index (and the count).
pub(crate) fn take_pool_index(
    used: &mut std::collections::BTreeSet<u32>,
    count: u32,
    index: u32,
) -> Result<()> {
    if index >= count {
        return Err(Error::InvalidArgument(format!(
            "event index {index} is not below the pool's count {count}"
        )));
    }
    if !used.insert(index) {
        return Err(Error::InvalidArgument(format!(
            "event index {index} of the pool is already in use"
        )));
    }
    Ok(())
}

/// The one-context rule (Level Zero: "the application must ensure the command queue, command
/// list and fence were created on the same context"; events appended to a list likewise):
/// an object of another context is `InvalidArgument`, naming what.
pub(crate) fn check_same_context(what: &str, theirs: u64, ours: u64) -> Result<()> {
    if theirs != ours {
        return Err(Error::InvalidArgument(format!(
            "{what} was created on context {theirs}, not on this object's context {ours}"
        )));
    }
    Ok(())
}
