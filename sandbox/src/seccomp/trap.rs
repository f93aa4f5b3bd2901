//! What a forbidden call does with `--seccomp on`: the filter answers `SECCOMP_RET_TRAP`, the
//! kernel raises SIGSYS in the calling thread without running the call, and this handler
//! writes one line naming the thread's kind, the call and its first arguments to stderr, then
//! ends the process by SIGSYS. A VMM killed by its sandbox says why on its own stderr (the VM
//! tests keep it), with no audit log needed.
//!
//! The process dies with SIGSYS either way: inside the handler SIGSYS is blocked, so the
//! handler makes a call no filter allows ([`DEATH_CALL`]), and the kernel, finding SIGSYS
//! blocked, resets it to its default action (terminate with a core dump) and delivers it.

use std::cell::Cell;

/// A call that every filter forbids (the rules' tests check it), made by the handler to die.
pub const DEATH_CALL: libc::c_long = libc::SYS_ptrace;

thread_local! {
    /// The kind of the calling thread, for the handler's message ("?" before confinement).
    static WHO: Cell<&'static str> = const { Cell::new("?") };
}

/// Records the calling thread's kind for the handler's message.
pub fn set_thread_name(name: &'static str) {
    WHO.with(|w| w.set(name));
}

/// Installs the SIGSYS handler for the process.
pub fn install_handler() -> std::io::Result<()> {
    // SAFETY: sigaction with a zeroed, then filled struct; the handler only makes
    // async-signal-safe calls (write, the death call) and reads a const-initialised
    // thread-local.
    let rc = unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_sigsys as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGSYS, &act, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A line buffer a signal handler can fill without allocating.
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, s: &[u8]) {
        for b in s {
            if self.len < self.buf.len() {
                self.buf[self.len] = *b;
                self.len += 1;
            }
        }
    }

    fn dec(&mut self, mut v: u64) {
        let mut d = [0u8; 20];
        let mut i = d.len();
        loop {
            i -= 1;
            d[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&d[i..]);
    }

    fn hex(&mut self, v: u64) {
        self.push(b"0x");
        let mut started = false;
        for shift in (0..16).rev() {
            let nib = ((v >> (shift * 4)) & 0xf) as u8;
            if nib != 0 || started || shift == 0 {
                started = true;
                self.push(&[if nib < 10 {
                    b'0' + nib
                } else {
                    b'a' + nib - 10
                }]);
            }
        }
    }
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    line.push(b"pmovmm: sandbox: a ");
    line.push(WHO.with(|w| w.get()).as_bytes());
    line.push(b" thread made a forbidden system call ");
    // SAFETY: for a seccomp SIGSYS the kernel fills the siginfo's sigsys member: the call
    // number is the int at offset 24 on x86_64 (after signo, errno, code, padding and the
    // call address).
    let nr = unsafe {
        info.cast::<u8>()
            .add(24)
            .cast::<libc::c_int>()
            .read_unaligned()
    };
    line.dec(u64::from(nr.unsigned_abs()));
    if !ctx.is_null() {
        // SAFETY: with SA_SIGINFO the third argument is the interrupted ucontext.
        let regs = unsafe { &(*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
        line.push(b" (");
        for (i, r) in [libc::REG_RDI, libc::REG_RSI, libc::REG_RDX]
            .iter()
            .enumerate()
        {
            if i > 0 {
                line.push(b", ");
            }
            line.hex(regs[*r as usize] as u64);
        }
        line.push(b", ...)");
    }
    line.push(b"; see docs/sandbox.md (--seccomp log)\n");
    // SAFETY: write(2) of a stack buffer, then a call every filter forbids: SIGSYS is
    // blocked in this handler, so the kernel delivers it with its default action.
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::syscall(DEATH_CALL, 0, 0, 0, 0);
        // Unreachable while a filter is installed; without one, leave all the same.
        libc::_exit(128 + libc::SIGSYS);
    }
}
