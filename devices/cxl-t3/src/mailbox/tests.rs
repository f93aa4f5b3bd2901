//! The mailbox through its registers, as a guest drives it: every command's output at the
//! offsets the CXL 2.0 tables give (read here by raw offset, independently of `payload.rs`),
//! invalid inputs, the doorbell protocol and the worker thread.

use super::*;
use crate::lsa::{LabelArea, Lsa, LsaError, MemLsa};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn le16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

struct Dirty(u32);
impl Health for Dirty {
    fn dirty_shutdown_count(&self) -> u32 {
        self.0
    }
}

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A manual mailbox (commands run at `run_pending`) over an LSA file.
fn mailbox(name: &str) -> (Mailbox, Tmp) {
    let p = std::env::temp_dir().join(format!("cxl-mb-{}-{name}.lsa", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let lsa = Lsa::open(&p).unwrap();
    let mb = Mailbox::manual(Commands::new(1 << 30, lsa, Box::new(Dirty(7))));
    (mb, Tmp(p))
}

fn doorbell(mb: &Mailbox) -> u32 {
    let mut c = [0u8; 4];
    mb.read(MB_CTRL, &mut c);
    u32::from_le_bytes(c) & 1
}

fn rc(mb: &Mailbox) -> u16 {
    let mut s = [0u8; 8];
    mb.read(MB_STATUS, &mut s);
    (u64::from_le_bytes(s) >> 32) as u16
}

/// Puts a command in the registers and rings, as Linux does (payload,
/// command, doorbell).
fn ring(mb: &mut Mailbox, opcode: u16, input: &[u8]) {
    for (i, chunk) in input.chunks(8).enumerate() {
        mb.write(MB_PAYLOAD + 8 * i as u64, chunk);
    }
    let cmd = u64::from(opcode) | ((input.len() as u64) << 16);
    mb.write(MB_CMD, &cmd.to_le_bytes());
    mb.write(MB_CTRL, &1u32.to_le_bytes());
}

/// The result of a completed command: (return code, output).
fn result(mb: &Mailbox, opcode: u16) -> (u16, Vec<u8>) {
    let mut cmd = [0u8; 8];
    mb.read(MB_CMD, &mut cmd);
    let cmd = u64::from_le_bytes(cmd);
    assert_eq!(cmd as u16, opcode);
    let len = ((cmd >> 16) & CMD_LEN_MASK) as usize;
    let mut out = vec![0u8; len];
    mb.read(MB_PAYLOAD, &mut out);
    (rc(mb), out)
}

/// Sends a command on a manual mailbox: the doorbell write only queues
/// it (doorbell still set), `run_pending` completes it.
fn send(mb: &mut Mailbox, opcode: u16, input: &[u8]) -> (u16, Vec<u8>) {
    ring(mb, opcode, input);
    assert_eq!(doorbell(mb), 1, "doorbell stays set until the command ran");
    assert!(mb.busy());
    assert!(mb.run_pending());
    assert!(!mb.run_pending(), "one command per doorbell");
    assert_eq!(doorbell(mb), 0, "doorbell clear once done");
    result(mb, opcode)
}

#[test]
fn capabilities_register() {
    let (mb, _t) = mailbox("cap");
    let mut c = [0u8; 4];
    mb.read(MB_CAP, &mut c);
    assert_eq!(u32::from_le_bytes(c) & 0x1f, PAYLOAD_SHIFT);
}

#[test]
fn supported_logs_and_cel() {
    let (mut mb, _t) = mailbox("cel");
    let (rc, out) = send(&mut mb, GET_SUPPORTED_LOGS, &[]);
    assert_eq!(rc, RC_SUCCESS);
    assert_eq!(out.len(), 8 + 20);
    assert_eq!(le16(&out, 0), Some(1));
    assert_eq!(out[8..24], CEL_UUID);
    let size = le32(&out, 24).unwrap();
    assert_eq!(size as usize, 4 * CEL.len());
    // Read the CEL in two chunks, as Linux does with a small payload.
    let mut cel = Vec::new();
    for (off, len) in [(0u32, 12u32), (12, size - 12)] {
        let mut inp = CEL_UUID.to_vec();
        inp.extend_from_slice(&off.to_le_bytes());
        inp.extend_from_slice(&len.to_le_bytes());
        let (rc, out) = send(&mut mb, GET_LOG, &inp);
        assert_eq!(rc, RC_SUCCESS);
        cel.extend(out);
    }
    let ops: Vec<u16> = cel
        .chunks(4)
        .map(|e| u16::from_le_bytes([e[0], e[1]]))
        .collect();
    assert_eq!(
        ops,
        vec![0x0400, 0x0401, 0x4000, 0x4102, 0x4103, 0x4200, 0x4203, 0x4204]
    );
    let effects_set_lsa = u16::from_le_bytes([cel[18], cel[19]]);
    assert_ne!(effects_set_lsa, 0);
    // Beyond the log, a wrong UUID, a short input: invalid input.
    let mut inp = CEL_UUID.to_vec();
    inp.extend_from_slice(&4u32.to_le_bytes());
    inp.extend_from_slice(&size.to_le_bytes());
    assert_eq!(send(&mut mb, GET_LOG, &inp).0, RC_INVALID_INPUT);
    let mut inp2 = inp.clone();
    inp2[0] ^= 1;
    assert_eq!(send(&mut mb, GET_LOG, &inp2).0, RC_INVALID_INPUT);
    assert_eq!(send(&mut mb, GET_LOG, &inp[..20]).0, RC_INVALID_INPUT);
    let mut huge = CEL_UUID.to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(send(&mut mb, GET_LOG, &huge).0, RC_INVALID_INPUT);
}

#[test]
fn identify_layout() {
    let (mut mb, _t) = mailbox("id");
    let (rc, out) = send(&mut mb, IDENTIFY, &[]);
    assert_eq!(rc, RC_SUCCESS);
    assert_eq!(out.len(), IDENTIFY_LEN);
    let u64_at = |o: usize| u64::from_le_bytes(out[o..o + 8].try_into().unwrap());
    assert_eq!(u64_at(0x10), 4, "total: 1 GiB in 256 MiB units");
    assert_eq!(u64_at(0x18), 0, "no volatile capacity");
    assert_eq!(u64_at(0x20), 4, "all persistent");
    assert_eq!(u64_at(0x28), 0, "not partitionable");
    assert_eq!(le32(&out, 0x38), Some(128 << 10), "LSA size");
    assert_eq!(send(&mut mb, IDENTIFY, &[1]).0, RC_INVALID_INPUT);
}

#[test]
fn lsa_commands_and_bounds() {
    let (mut mb, _t) = mailbox("lsa");
    let mut set = 0x100u32.to_le_bytes().to_vec();
    set.extend_from_slice(&[0; 4]);
    set.extend_from_slice(b"namespace-label");
    assert_eq!(send(&mut mb, SET_LSA, &set).0, RC_SUCCESS);
    let mut get = 0x100u32.to_le_bytes().to_vec();
    get.extend_from_slice(&15u32.to_le_bytes());
    let (rc, out) = send(&mut mb, GET_LSA, &get);
    assert_eq!((rc, out.as_slice()), (RC_SUCCESS, &b"namespace-label"[..]));
    // Past the end, too long for the payload, malformed inputs.
    let mut past = ((128u32 << 10) - 4).to_le_bytes().to_vec();
    past.extend_from_slice(&8u32.to_le_bytes());
    assert_eq!(send(&mut mb, GET_LSA, &past).0, RC_INVALID_INPUT);
    let mut long = 0u32.to_le_bytes().to_vec();
    long.extend_from_slice(&(PAYLOAD_SIZE as u32 + 1).to_le_bytes());
    assert_eq!(send(&mut mb, GET_LSA, &long).0, RC_INVALID_INPUT);
    assert_eq!(send(&mut mb, GET_LSA, &get[..7]).0, RC_INVALID_INPUT);
    let mut set_past = u32::MAX.to_le_bytes().to_vec();
    set_past.extend_from_slice(&[0; 4]);
    set_past.push(1);
    assert_eq!(send(&mut mb, SET_LSA, &set_past).0, RC_INVALID_INPUT);
    assert_eq!(send(&mut mb, SET_LSA, &[0; 5]).0, RC_INVALID_INPUT);
}

#[test]
fn health_and_shutdown_state() {
    let (mut mb, _t) = mailbox("health");
    let (rc, out) = send(&mut mb, GET_HEALTH_INFO, &[]);
    assert_eq!(rc, RC_SUCCESS);
    assert_eq!(out.len(), HEALTH_INFO_LEN);
    assert_eq!(le32(&out, 6), Some(7));
    assert_eq!(
        send(&mut mb, GET_SHUTDOWN_STATE, &[]),
        (RC_SUCCESS, vec![0])
    );
    assert_eq!(send(&mut mb, SET_SHUTDOWN_STATE, &[1]).0, RC_SUCCESS);
    assert_eq!(
        send(&mut mb, GET_SHUTDOWN_STATE, &[]),
        (RC_SUCCESS, vec![1])
    );
    assert_eq!(
        send(&mut mb, SET_SHUTDOWN_STATE, &[1, 2]).0,
        RC_INVALID_INPUT
    );
    assert_eq!(send(&mut mb, GET_HEALTH_INFO, &[0]).0, RC_INVALID_INPUT);
}

#[test]
fn unknown_opcodes_and_bad_lengths() {
    let (mut mb, _t) = mailbox("bad");
    for op in [0x0000u16, 0x0100, 0x4100, 0x4300, 0xffff] {
        assert_eq!(send(&mut mb, op, &[]).0, RC_UNSUPPORTED, "opcode {op:#x}");
    }
    // A length field larger than the payload area: answered at once.
    let cmd = u64::from(IDENTIFY) | ((PAYLOAD_SIZE as u64 + 1) << 16);
    mb.write(MB_CMD, &cmd.to_le_bytes());
    mb.write(MB_CTRL, &[1]);
    assert_eq!(doorbell(&mb), 0);
    assert!(!mb.run_pending());
    let mut s = [0u8; 8];
    mb.read(MB_STATUS, &mut s);
    assert_eq!((u64::from_le_bytes(s) >> 32) as u16, RC_INVALID_INPUT);
    // Writes far outside the register space and odd sizes are harmless.
    mb.write(u64::MAX - 2, &[1, 2, 3, 4, 5]);
    mb.write(MB_STATUS, &[0xff; 8]);
    mb.read(MB_STATUS, &mut s);
    assert_eq!(
        (u64::from_le_bytes(s) >> 32) as u16,
        RC_INVALID_INPUT,
        "status is read-only"
    );
    let mut far = [0xaau8; 3];
    mb.read(MAILBOX_LEN + 10, &mut far);
    assert_eq!(far, [0; 3]);
}

#[test]
fn writes_while_busy_are_ignored() {
    let (mut mb, _t) = mailbox("busy");
    let mut set = 0x40u32.to_le_bytes().to_vec();
    set.extend_from_slice(&[0; 4]);
    set.extend_from_slice(b"first");
    ring(&mut mb, SET_LSA, &set);
    assert_eq!(doorbell(&mb), 1);
    // The guest scribbles over the payload and the command and rings again.
    mb.write(MB_PAYLOAD + 8, b"XXXXX");
    mb.write(MB_CMD, &u64::from(IDENTIFY).to_le_bytes());
    mb.write(MB_CTRL, &[1]);
    let mut cmd = [0u8; 8];
    mb.read(MB_CMD, &mut cmd);
    assert_eq!(u64::from_le_bytes(cmd) as u16, SET_LSA);
    assert!(mb.run_pending());
    assert!(!mb.run_pending(), "the second ring was ignored");
    assert_eq!(result(&mb, SET_LSA), (RC_SUCCESS, vec![]));
    let mut get = 0x40u32.to_le_bytes().to_vec();
    get.extend_from_slice(&5u32.to_le_bytes());
    assert_eq!(
        send(&mut mb, GET_LSA, &get),
        (RC_SUCCESS, b"first".to_vec())
    );
}

/// Hang guard of the worker test below; passing never depends on it.
const WATCHDOG: Duration = Duration::from_secs(60);

/// A label area whose `sync` blocks until the test releases it. If the
/// release never comes, the watchdog lets it return and records that
/// it fired, so a broken mailbox fails the test instead of hanging it.
struct HeldLsa {
    mem: MemLsa,
    entered: Sender<()>,
    release: Receiver<()>,
    watchdog_fired: Arc<AtomicBool>,
}

impl LabelArea for HeldLsa {
    fn size(&self) -> u64 {
        LabelArea::size(&self.mem)
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, LsaError> {
        self.mem.read(offset, len)
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), LsaError> {
        self.mem.write(offset, data)
    }
    fn sync(&self) -> Result<(), LsaError> {
        let _ = self.entered.send(());
        if self.release.recv_timeout(WATCHDOG).is_err() {
            self.watchdog_fired.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Polls the doorbell until the worker cleared it (bounded by the watchdog).
fn wait_done(mb: &Mailbox) {
    let deadline = Instant::now() + WATCHDOG;
    while doorbell(mb) == 1 {
        assert!(Instant::now() < deadline, "the command never completed");
        std::thread::yield_now();
    }
}

/// The doorbell write of a SET_LSA returns while the label area's sync
/// is still blocked; the command completes (doorbell clear, return
/// code, output length) only once the sync returns.
#[test]
fn set_lsa_sync_runs_on_the_worker_not_in_the_doorbell_write() {
    let mem = MemLsa::new(4096);
    let (entered_tx, entered) = mpsc::channel();
    let (release, release_rx) = mpsc::channel();
    let fired = Arc::new(AtomicBool::new(false));
    let lsa = HeldLsa {
        mem: mem.clone(),
        entered: entered_tx,
        release: release_rx,
        watchdog_fired: fired.clone(),
    };
    let mut mb = Mailbox::new(Commands::new(1 << 30, lsa, Box::new(Dirty(0)))).unwrap();
    // A first command leaves a non-zero return code in the status.
    ring(&mut mb, 0x7777, &[]);
    wait_done(&mb);
    assert_eq!(rc(&mb), RC_UNSUPPORTED);
    let mut set = 0x100u32.to_le_bytes().to_vec();
    set.extend_from_slice(&[0; 4]);
    set.extend_from_slice(b"durable-label");
    ring(&mut mb, SET_LSA, &set);
    // Had the write run the command, it would have sat in sync() until
    // the watchdog fired.
    assert!(
        !fired.load(Ordering::SeqCst),
        "the doorbell write waited for the sync"
    );
    entered
        .recv_timeout(WATCHDOG)
        .expect("the worker never reached the sync");
    // The worker is inside the sync: busy, no result yet.
    assert_eq!(doorbell(&mb), 1);
    assert!(mb.busy());
    assert_eq!(rc(&mb), RC_UNSUPPORTED, "status is the old command's");
    assert_eq!(&mem.contents()[0x100..0x10d], b"durable-label");
    mb.write(MB_CTRL, &[1]);
    release.send(()).unwrap();
    wait_done(&mb);
    assert!(!fired.load(Ordering::SeqCst));
    assert_eq!(result(&mb, SET_LSA), (RC_SUCCESS, vec![]));
    // The ring while busy did not queue a second SET_LSA, and GET_LSA
    // (also on the worker) syncs nothing.
    let mut get = 0x100u32.to_le_bytes().to_vec();
    get.extend_from_slice(&13u32.to_le_bytes());
    ring(&mut mb, GET_LSA, &get);
    wait_done(&mb);
    assert_eq!(
        result(&mb, GET_LSA),
        (RC_SUCCESS, b"durable-label".to_vec())
    );
    assert!(entered.try_recv().is_err(), "one sync, for the one SET_LSA");
    drop(mb);
}
