//! The primary mailbox: its registers, the doorbell protocol and the worker that runs
//! commands. The commands themselves are `commands.rs`, their payloads `payload.rs`.
//!
//! Ringing the doorbell never runs a command inside the MMIO write (a
//! vCPU's exit): the write copies the command out and hands it to the
//! mailbox's worker thread, and the doorbell bit stays set until the worker
//! has put the output payload, the command register's output length and
//! the return code in place, then clears it. That is the mailbox's own
//! protocol (CXL 2.0 8.2.8.4: the caller polls the doorbell; the device
//! owns the registers while it is set), so a command that does disk I/O
//! (GET/SET_LSA, whose `fdatasync` can take long on a busy host) keeps the
//! vCPU only as long as a register copy. Linux polls the doorbell for up to
//! 2 s. Writes to the mailbox while the doorbell is set are ignored.
//!
//! Every input field is checked before use: a malformed command gets a
//! return code (Invalid Input, Unsupported), never a panic.

use core::mem::offset_of;

use locked::Locked;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use threads::{JoinHandle, ThreadKind};

use zerocopy::{Immutable, IntoBytes};

mod commands;
pub mod payload;
#[cfg(test)]
mod tests;

pub use commands::{
    Commands, FixedHealth, Health, CAPACITY_UNIT, CEL, CEL_UUID, GET_HEALTH_INFO, GET_LOG, GET_LSA,
    GET_SHUTDOWN_STATE, GET_SUPPORTED_LOGS, HEALTH_INFO_LEN, IDENTIFY, IDENTIFY_LEN,
    RC_INTERNAL_ERROR, RC_INVALID_INPUT, RC_SUCCESS, RC_UNSUPPORTED, SET_LSA, SET_SHUTDOWN_STATE,
};

/// Payload area size: 2^11 = 2 KiB (Linux wants at least 256 bytes).
/// This exponent is what the Mailbox Capabilities register reports.
pub const PAYLOAD_SHIFT: u32 = 11;
/// Payload area size in bytes, `1 << PAYLOAD_SHIFT`.
pub const PAYLOAD_SIZE: usize = 1 << PAYLOAD_SHIFT;

// Register offsets inside the mailbox capability (CXL 2.0 8.2.8.4, Mailbox
// Registers).

/// Mailbox Capabilities (32 bits, read-only): bits 4:0 give the payload
/// size as a power of two; no interrupt support is advertised.
pub const MB_CAP: u64 = 0x00;
/// Mailbox Control (32 bits): bit 0 is the doorbell, set by the caller to
/// submit a command and cleared by the device when it completed.
pub const MB_CTRL: u64 = 0x04;
/// Command register (64 bits): bits 15:0 opcode, bits 36:16 payload length
/// in bytes (input on submit, output on completion).
pub const MB_CMD: u64 = 0x08;
/// Mailbox Status (64 bits, read-only): bits 47:32 hold the return code
/// (`RC_*`) of the last command.
pub const MB_STATUS: u64 = 0x10;
/// Background Command Status (64 bits): always zero here, as no command
/// runs in the background.
pub const MB_BG_STATUS: u64 = 0x18;
/// Commands Payload registers: start of the input/output payload area.
pub const MB_PAYLOAD: u64 = 0x20;
/// Bytes of register space: header plus payload.
pub const MAILBOX_LEN: u64 = MB_PAYLOAD + PAYLOAD_SIZE as u64;

const CTRL_DOORBELL: u32 = 1;
const CMD_LEN_SHIFT: u32 = 16;
const CMD_LEN_MASK: u64 = (1 << 21) - 1;
const STATUS_RC_SHIFT: u32 = 32;

/// The registers before the payload area, as the guest reads them (little endian; native
/// integers, so little-endian hosts only: asserted in `payload.rs`).
#[derive(IntoBytes, Immutable)]
#[repr(C, packed)]
struct RegisterHeader {
    capabilities: u32,
    control: u32,
    command: u64,
    status: u64,
    background_status: u64,
}

const _: () = {
    assert!(offset_of!(RegisterHeader, capabilities) == MB_CAP as usize);
    assert!(offset_of!(RegisterHeader, control) == MB_CTRL as usize);
    assert!(offset_of!(RegisterHeader, command) == MB_CMD as usize);
    assert!(offset_of!(RegisterHeader, status) == MB_STATUS as usize);
    assert!(offset_of!(RegisterHeader, background_status) == MB_BG_STATUS as usize);
    assert!(size_of::<RegisterHeader>() == MB_PAYLOAD as usize);
};

/// Errors building a mailbox.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The worker thread that runs commands could not be started.
    #[error("mailbox worker thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// The registers the guest sees, shared by the vCPU side and the worker.
struct Regs {
    /// The doorbell: set from ringing until the command completed.
    busy: bool,
    cmd: u64,
    status: u64,
    payload: Box<[u8; PAYLOAD_SIZE]>,
}

/// A command copied out of the registers when the doorbell rang.
struct Job {
    opcode: u16,
    input: Vec<u8>,
}

/// Where commands run.
enum Exec {
    /// The device's worker thread (what the VMM uses). `tx` is `None` only
    /// while dropping.
    Worker {
        tx: Option<Sender<Job>>,
        thread: Option<JoinHandle<()>>,
    },
    /// Nowhere until [`Mailbox::run_pending`]: tests and fuzz targets step
    /// the device without threads.
    Manual {
        commands: Box<Commands>,
        pending: Option<Job>,
    },
}

/// The mailbox registers around a [`Commands`].
pub struct Mailbox {
    regs: Arc<Mutex<Regs>>,
    exec: Exec,
}

/// Puts a finished command's result in the registers and clears the
/// doorbell (last, under the same lock: a guest that sees it clear sees the
/// result).
fn complete(regs: &Mutex<Regs>, opcode: u16, rc: u16, out: &[u8]) {
    let mut r = regs.locked();
    let out_len = if rc == RC_SUCCESS {
        let n = out.len().min(PAYLOAD_SIZE);
        r.payload[..n].copy_from_slice(&out[..n]);
        n
    } else {
        0
    };
    r.cmd = u64::from(opcode) | ((out_len as u64) << CMD_LEN_SHIFT);
    r.status = u64::from(rc) << STATUS_RC_SHIFT;
    r.busy = false;
}

fn run(commands: &mut Commands, regs: &Mutex<Regs>, job: Job, out: &mut Vec<u8>) {
    out.clear();
    let rc = commands.execute(job.opcode, &job.input, out);
    complete(regs, job.opcode, rc, out);
}

impl Mailbox {
    /// A mailbox whose commands run on a worker thread of their own.
    pub fn new(mut commands: Commands) -> Result<Self, MailboxError> {
        let regs = Arc::new(Mutex::new(Regs {
            busy: false,
            cmd: 0,
            status: 0,
            payload: Box::new([0; PAYLOAD_SIZE]),
        }));
        let (tx, rx): (Sender<Job>, Receiver<Job>) = mpsc::channel();
        let shared = regs.clone();
        let thread = threads::spawn(ThreadKind::CxlMailbox, "cxl-mailbox", move || {
            let mut out = Vec::with_capacity(PAYLOAD_SIZE);
            // Ends when the mailbox drops its sender.
            for job in rx {
                run(&mut commands, &shared, job, &mut out);
            }
        })?;
        Ok(Mailbox {
            regs,
            exec: Exec::Worker {
                tx: Some(tx),
                thread: Some(thread),
            },
        })
    }

    /// A mailbox without a thread: a rung command waits (doorbell set)
    /// until [`Mailbox::run_pending`] runs it. For tests and fuzz targets.
    pub fn manual(commands: Commands) -> Self {
        Mailbox {
            regs: Arc::new(Mutex::new(Regs {
                busy: false,
                cmd: 0,
                status: 0,
                payload: Box::new([0; PAYLOAD_SIZE]),
            })),
            exec: Exec::Manual {
                commands: Box::new(commands),
                pending: None,
            },
        }
    }

    /// Manual mailbox: runs the command the doorbell queued, if any, and
    /// says whether there was one. A worker mailbox runs its own: false.
    pub fn run_pending(&mut self) -> bool {
        let Exec::Manual { commands, pending } = &mut self.exec else {
            return false;
        };
        let Some(job) = pending.take() else {
            return false;
        };
        let mut out = Vec::new();
        run(commands, &self.regs, job, &mut out);
        true
    }

    /// The doorbell is set: a command is queued or running.
    pub fn busy(&self) -> bool {
        self.regs.locked().busy
    }

    /// Reads any 1..8 bytes at `offset`; out-of-range bytes read as zero.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let r = self.regs.locked();
        let header = RegisterHeader {
            capabilities: PAYLOAD_SHIFT,
            control: u32::from(r.busy),
            command: r.cmd,
            status: r.status,
            background_status: 0,
        };
        let h = header.as_bytes();
        for (i, d) in data.iter_mut().enumerate() {
            let o = offset.saturating_add(i as u64);
            *d = if o < MB_PAYLOAD {
                h[o as usize]
            } else {
                usize::try_from(o - MB_PAYLOAD)
                    .ok()
                    .and_then(|p| r.payload.get(p).copied())
                    .unwrap_or(0)
            };
        }
    }

    /// Writes any 1..8 bytes at `offset`. A write that sets the doorbell
    /// hands the command to the worker and returns at once; the doorbell
    /// reads set until the command completed. While it is set, writes are
    /// ignored (the device owns the registers).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let job = {
            let mut r = self.regs.locked();
            if r.busy {
                return;
            }
            let mut cmd = r.cmd.to_le_bytes();
            let mut ring = false;
            for (i, b) in data.iter().enumerate() {
                let o = offset.saturating_add(i as u64);
                if o >= MB_PAYLOAD {
                    if let Some(p) = usize::try_from(o - MB_PAYLOAD)
                        .ok()
                        .and_then(|p| r.payload.get_mut(p))
                    {
                        *p = *b;
                    }
                } else if (MB_CMD..MB_STATUS).contains(&o) {
                    cmd[(o - MB_CMD) as usize] = *b;
                } else if o == MB_CTRL {
                    // Doorbell is the only control bit (no interrupts offered).
                    ring |= b & CTRL_DOORBELL as u8 != 0;
                }
            }
            r.cmd = u64::from_le_bytes(cmd);
            if !ring {
                return;
            }
            let opcode = r.cmd as u16;
            let len = ((r.cmd >> CMD_LEN_SHIFT) & CMD_LEN_MASK) as usize;
            match r.payload.get(..len).map(<[u8]>::to_vec) {
                Some(input) => {
                    r.busy = true;
                    Job { opcode, input }
                }
                None => {
                    // Longer than the payload area: answered here, no I/O.
                    drop(r);
                    complete(&self.regs, opcode, RC_INVALID_INPUT, &[]);
                    return;
                }
            }
        };
        match &mut self.exec {
            Exec::Worker { tx, .. } => {
                let opcode = job.opcode;
                let sent = tx.as_ref().is_some_and(|tx| tx.send(job).is_ok());
                if !sent {
                    log::error!("cxl-t3 mailbox: worker thread is gone");
                    complete(&self.regs, opcode, RC_INTERNAL_ERROR, &[]);
                }
            }
            Exec::Manual { pending, .. } => *pending = Some(job),
        }
    }
}

impl Drop for Mailbox {
    /// Lets a command in flight finish (a SET_LSA the guest was told
    /// nothing about yet still becomes durable) and joins the worker.
    fn drop(&mut self) {
        if let Exec::Worker { tx, thread } = &mut self.exec {
            drop(tx.take());
            if let Some(t) = thread.take() {
                let _ = t.join();
            }
        }
    }
}
