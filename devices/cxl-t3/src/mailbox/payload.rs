//! The mailbox commands' input and output payloads (CXL 2.0 8.2.9), one typed struct each.
//!
//! Each is `#[repr(C, packed)]` with `zerocopy` derives, which prove it has no padding and
//! that any bytes are a valid value, so an input is read from the guest's bytes only at its
//! exact length and an output is written as the struct's bytes. The sizes and the offsets
//! that Linux 6.1 reads are asserted against the specification's tables at compile time.
//! Fields are native integers for the little-endian payloads: little-endian hosts only
//! (asserted, the VMM runs on x86-64).

use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

const _: () = assert!(cfg!(target_endian = "little"));

/// Get Supported Logs output, before its entries.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct SupportedLogsHeader {
    /// Entries that follow.
    pub entries: u16,
    /// Zero.
    pub reserved: [u8; 6],
}

/// One Get Supported Logs entry.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct SupportedLogEntry {
    /// The log's UUID.
    pub uuid: [u8; 16],
    /// Bytes of the log.
    pub size: u32,
}

/// Get Log input.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct GetLogIn {
    /// Which log.
    pub uuid: [u8; 16],
    /// Bytes into the log.
    pub offset: u32,
    /// Bytes wanted.
    pub length: u32,
}

/// One Command Effects Log entry.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct CelEntry {
    /// The command.
    pub opcode: u16,
    /// What running it changes (`EFFECT_*` bits).
    pub effect: u16,
}

/// Identify Memory Device output; Linux 6.1 wants exactly these bytes.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct Identify {
    /// Firmware revision, ASCII, NUL padded.
    pub fw_revision: [u8; 16],
    /// Total capacity in [`super::CAPACITY_UNIT`]s.
    pub total_capacity: u64,
    /// Volatile-only capacity, same unit.
    pub volatile_only_capacity: u64,
    /// Persistent-only capacity, same unit.
    pub persistent_only_capacity: u64,
    /// Partition alignment, same unit (0: not partitionable).
    pub partition_align: u64,
    /// Informational event log size (events).
    pub info_event_log_size: u16,
    /// Warning event log size.
    pub warning_event_log_size: u16,
    /// Failure event log size.
    pub failure_event_log_size: u16,
    /// Fatal event log size.
    pub fatal_event_log_size: u16,
    /// Bytes of the label storage area.
    pub lsa_size: u32,
    /// Poison list maximum media error records (24 bits).
    pub poison_list_max_records: [u8; 3],
    /// Inject poison limit.
    pub inject_poison_limit: u16,
    /// Poison handling capabilities.
    pub poison_caps: u8,
    /// QoS telemetry capabilities.
    pub qos_telemetry_caps: u8,
}

const _: () = {
    assert!(size_of::<Identify>() == 0x43);
    assert!(offset_of!(Identify, total_capacity) == 0x10);
    assert!(offset_of!(Identify, volatile_only_capacity) == 0x18);
    assert!(offset_of!(Identify, persistent_only_capacity) == 0x20);
    assert!(offset_of!(Identify, partition_align) == 0x28);
    assert!(offset_of!(Identify, lsa_size) == 0x38);
    assert!(offset_of!(Identify, qos_telemetry_caps) == 0x42);
};

/// Get Health Info output.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct HealthInfo {
    /// Health status bits (0: all good).
    pub health_status: u8,
    /// Media status (0: normal).
    pub media_status: u8,
    /// Additional status.
    pub additional_status: u8,
    /// Life used, percent.
    pub life_used: u8,
    /// Device temperature, degrees Celsius.
    pub temperature: u16,
    /// Shutdowns that did not flush the device first.
    pub dirty_shutdown_count: u32,
    /// Corrected volatile errors.
    pub corrected_volatile_errors: u32,
    /// Corrected persistent errors.
    pub corrected_persistent_errors: u32,
}

const _: () = {
    assert!(size_of::<HealthInfo>() == 0x12);
    assert!(offset_of!(HealthInfo, dirty_shutdown_count) == 0x06);
};

/// Get LSA input.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct GetLsaIn {
    /// Bytes into the label storage area.
    pub offset: u32,
    /// Bytes wanted.
    pub length: u32,
}

/// Set LSA input before its data.
#[derive(Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C, packed)]
pub struct SetLsaHeader {
    /// Bytes into the label storage area.
    pub offset: u32,
    /// Ignored.
    pub reserved: u32,
}

const _: () = {
    assert!(size_of::<SupportedLogsHeader>() == 8 && size_of::<SupportedLogEntry>() == 0x14);
    assert!(size_of::<GetLogIn>() == 0x18 && size_of::<CelEntry>() == 4);
    assert!(size_of::<GetLsaIn>() == 8 && size_of::<SetLsaHeader>() == 8);
};
