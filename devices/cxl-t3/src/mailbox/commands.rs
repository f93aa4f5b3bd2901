//! The commands the mailbox executes: opcodes, return codes, the Command Effects Log, and
//! [`Commands`], which answers each from the device's identity, label area and health.
//!
//! Every input is read through its payload struct (`payload.rs`) at exactly its length, or at
//! least its header's for SET_LSA; any other length is Invalid Input, never a panic.

use zerocopy::{FromBytes, IntoBytes};

use super::payload::{
    CelEntry, GetLogIn, GetLsaIn, HealthInfo, Identify, SetLsaHeader, SupportedLogEntry,
    SupportedLogsHeader,
};
use super::PAYLOAD_SIZE;
use crate::lsa::LabelArea;

// Opcodes we implement (CXL 2.0 8.2.9): the high byte is the command set,
// the low byte the command within it.

/// Get Supported Logs (Logs set 04h): lists the logs the device keeps; here
/// only the Command Effects Log.
pub const GET_SUPPORTED_LOGS: u16 = 0x0400;
/// Get Log (Logs set 04h): reads part of a log by UUID; here only the CEL.
pub const GET_LOG: u16 = 0x0401;
/// Identify Memory Device (set 40h): firmware revision, capacities and
/// LSA size.
pub const IDENTIFY: u16 = 0x4000;
/// Get LSA (Capacity Config and Label Storage set 41h): reads label
/// storage area bytes.
pub const GET_LSA: u16 = 0x4102;
/// Set LSA (set 41h): writes label storage area bytes, durably.
pub const SET_LSA: u16 = 0x4103;
/// Get Health Info (Health Info and Alerts set 42h): health and media
/// status and the Dirty Shutdown Count.
pub const GET_HEALTH_INFO: u16 = 0x4200;
/// Get Shutdown State (set 42h): reads the state byte the host last set.
pub const GET_SHUTDOWN_STATE: u16 = 0x4203;
/// Set Shutdown State (set 42h): the host marks itself running (dirty,
/// bit 0 set) or cleanly shut down (bit 0 clear).
pub const SET_SHUTDOWN_STATE: u16 = 0x4204;

// Return codes (CXL 2.0 table 150), in bits 47:32 of Mailbox Status.

/// Success: the command completed and the output payload is valid.
pub const RC_SUCCESS: u16 = 0x0000;
/// Invalid Input: a field or the payload length of the command is wrong.
pub const RC_INVALID_INPUT: u16 = 0x0002;
/// Unsupported: the opcode is not implemented.
pub const RC_UNSUPPORTED: u16 = 0x0003;
/// Internal Error: the device failed to carry out a well-formed command
/// (e.g. host I/O on the LSA file failed).
pub const RC_INTERNAL_ERROR: u16 = 0x0004;

/// Command Effects Log UUID 0da9c0b5-bf41-4b78-8f79-96b1623b3f17, in the
/// byte order it travels in.
pub const CEL_UUID: [u8; 16] = [
    0x0d, 0xa9, 0xc0, 0xb5, 0xbf, 0x41, 0x4b, 0x78, 0x8f, 0x79, 0x96, 0xb1, 0x62, 0x3b, 0x3f, 0x17,
];

/// Command effects: immediate configuration change (bit 1), immediate
/// data change (bit 2).
const EFFECT_CONFIG: u16 = 1 << 1;
const EFFECT_DATA: u16 = 1 << 2;

/// Every command we implement with its effects, in CEL order.
pub const CEL: &[(u16, u16)] = &[
    (GET_SUPPORTED_LOGS, 0),
    (GET_LOG, 0),
    (IDENTIFY, 0),
    (GET_LSA, 0),
    (SET_LSA, EFFECT_CONFIG | EFFECT_DATA),
    (GET_HEALTH_INFO, 0),
    (GET_SHUTDOWN_STATE, 0),
    (SET_SHUTDOWN_STATE, EFFECT_CONFIG),
];

/// IDENTIFY reports capacities in these units.
pub const CAPACITY_UNIT: u64 = 256 << 20;
/// Length of the IDENTIFY output Linux 6.1 expects exactly.
pub const IDENTIFY_LEN: usize = size_of::<Identify>();
/// Length of the GET_HEALTH_INFO output.
pub const HEALTH_INFO_LEN: usize = size_of::<HealthInfo>();

/// Where the device's persistent health counters come from (the expander).
pub trait Health: Send {
    /// Shutdowns of the device that did not flush its cache first.
    fn dirty_shutdown_count(&self) -> u32;
}

/// A fixed Dirty Shutdown Count: for tests and fuzz targets, which build a
/// device with `DeviceRegs::manual(Commands::new(size, MemLsa::new(..),
/// Box::new(FixedHealth(0))))` and need no files or threads.
pub struct FixedHealth(pub u32);

impl Health for FixedHealth {
    fn dirty_shutdown_count(&self) -> u32 {
        self.0
    }
}

/// What the commands answer from: the device's identity, LSA and health.
pub struct Commands {
    /// Persistent capacity in bytes (a multiple of [`CAPACITY_UNIT`]).
    pub capacity: u64,
    /// The label storage area GET_LSA and SET_LSA access.
    pub lsa: Box<dyn LabelArea>,
    /// Source of the Dirty Shutdown Count GET_HEALTH_INFO reports.
    pub health: Box<dyn Health>,
    /// Shutdown state set by the host OS (bit 0: dirty).
    shutdown_state: u8,
}

impl Commands {
    /// A device of `capacity` bytes with label area `lsa` and health
    /// counters from `health`; the shutdown state starts at 0 (clean).
    pub fn new(capacity: u64, lsa: impl LabelArea + 'static, health: Box<dyn Health>) -> Self {
        Commands {
            capacity,
            lsa: Box::new(lsa),
            health,
            shutdown_state: 0,
        }
    }

    /// The Command Effects Log as bytes.
    pub fn cel_bytes() -> Vec<u8> {
        CEL.iter()
            .flat_map(|&(opcode, effect)| CelEntry { opcode, effect }.as_bytes().to_vec())
            .collect()
    }

    /// Executes `opcode` with `input`; on success `out` holds the output
    /// payload (at most [`PAYLOAD_SIZE`] bytes). Returns the return code.
    pub fn execute(&mut self, opcode: u16, input: &[u8], out: &mut Vec<u8>) -> u16 {
        out.clear();
        let empty = input.is_empty();
        match opcode {
            GET_SUPPORTED_LOGS if empty => {
                let header = SupportedLogsHeader {
                    entries: 1,
                    ..Default::default()
                };
                let cel = SupportedLogEntry {
                    uuid: CEL_UUID,
                    size: (CEL.len() * size_of::<CelEntry>()) as u32,
                };
                out.extend_from_slice(header.as_bytes());
                out.extend_from_slice(cel.as_bytes());
                RC_SUCCESS
            }
            GET_LOG => self.get_log(input, out),
            IDENTIFY if empty => {
                out.extend_from_slice(self.identify().as_bytes());
                RC_SUCCESS
            }
            GET_LSA => self.get_lsa(input, out),
            SET_LSA => self.set_lsa(input),
            GET_HEALTH_INFO if empty => {
                // Health status 0 (all good), media status 0 (normal).
                let health = HealthInfo {
                    dirty_shutdown_count: self.health.dirty_shutdown_count(),
                    ..Default::default()
                };
                out.extend_from_slice(health.as_bytes());
                RC_SUCCESS
            }
            GET_SHUTDOWN_STATE if empty => {
                out.push(self.shutdown_state);
                RC_SUCCESS
            }
            SET_SHUTDOWN_STATE => match input {
                [state] => {
                    self.shutdown_state = state & 1;
                    RC_SUCCESS
                }
                _ => RC_INVALID_INPUT,
            },
            GET_SUPPORTED_LOGS | IDENTIFY | GET_HEALTH_INFO | GET_SHUTDOWN_STATE => {
                RC_INVALID_INPUT
            }
            _ => RC_UNSUPPORTED,
        }
    }

    fn identify(&self) -> Identify {
        let mut fw_revision = [0u8; 16];
        let fw = b"pmovmm-cxl-t3 1";
        fw_revision[..fw.len()].copy_from_slice(fw);
        let units = self.capacity / CAPACITY_UNIT;
        Identify {
            fw_revision,
            total_capacity: units,
            // No volatile-only capacity; not partitionable.
            persistent_only_capacity: units,
            lsa_size: u32::try_from(self.lsa.size()).unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    fn get_log(&self, input: &[u8], out: &mut Vec<u8>) -> u16 {
        let Ok(req) = GetLogIn::read_from_bytes(input) else {
            return RC_INVALID_INPUT;
        };
        if req.uuid != CEL_UUID {
            return RC_INVALID_INPUT;
        }
        let cel = Self::cel_bytes();
        let (offset, len) = (req.offset as usize, req.length as usize);
        match offset.checked_add(len) {
            Some(end) if end <= cel.len() && len <= PAYLOAD_SIZE => {
                out.extend_from_slice(&cel[offset..end]);
                RC_SUCCESS
            }
            _ => RC_INVALID_INPUT,
        }
    }

    fn get_lsa(&self, input: &[u8], out: &mut Vec<u8>) -> u16 {
        let Ok(req) = GetLsaIn::read_from_bytes(input) else {
            return RC_INVALID_INPUT;
        };
        if req.length as usize > PAYLOAD_SIZE {
            return RC_INVALID_INPUT;
        }
        match self.lsa.read(req.offset.into(), req.length.into()) {
            Ok(data) => {
                *out = data;
                RC_SUCCESS
            }
            Err(crate::lsa::LsaError::Bounds { .. }) => RC_INVALID_INPUT,
            Err(e) => {
                log::error!("cxl-t3 GET_LSA: {e}");
                RC_INTERNAL_ERROR
            }
        }
    }

    fn set_lsa(&self, input: &[u8]) -> u16 {
        let Ok((req, data)) = SetLsaHeader::read_from_prefix(input) else {
            return RC_INVALID_INPUT;
        };
        // Labels are written rarely (namespace changes) and must survive a
        // crash right after the command completes: sync before answering.
        match self
            .lsa
            .write(req.offset.into(), data)
            .and_then(|()| self.lsa.sync())
        {
            Ok(()) => RC_SUCCESS,
            Err(crate::lsa::LsaError::Bounds { .. }) => RC_INVALID_INPUT,
            Err(e) => {
                log::error!("cxl-t3 SET_LSA: {e}");
                RC_INTERNAL_ERROR
            }
        }
    }
}
