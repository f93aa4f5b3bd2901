//! The sandbox on real threads: each case runs in a child process (this test binary again,
//! `SANDBOX_CASE` set), because filters and the start hook are for the life of a process and
//! a kill must not take the test runner with it.

// Helpers outside `#[test]` functions unwrap too: a failure here is a test failure.
#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Command;

use pmo_sandbox::{FileRule, LandlockMode, Policy, Sandbox, SeccompMode, ThreadKind};

const CASE: &str = "SANDBOX_CASE";
const DONE: &str = "SANDBOX-CHILD-DONE";

struct Child {
    status: std::process::ExitStatus,
    text: String,
}

impl Child {
    fn killed_by_sigsys(&self) -> bool {
        self.status.signal() == Some(libc::SIGSYS)
    }
    fn finished(&self) -> bool {
        self.status.success() && self.text.contains(DONE)
    }
}

fn run(case: &str) -> Child {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CASE, case)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Child {
        status: out.status,
        text,
    }
}

fn kind_by_name(name: &str) -> Option<ThreadKind> {
    ThreadKind::ALL.iter().copied().find(|k| k.name() == name)
}

fn say(what: &str) {
    // stderr is unbuffered: one write per line, allowed to every kind.
    let _ = writeln!(std::io::stderr(), "{what}");
}

fn finish() -> ! {
    say(DONE);
    std::process::exit(0)
}

fn policy(seccomp: &str) -> Policy {
    Policy {
        seccomp: SeccompMode::from_name(seccomp).unwrap(),
        landlock: LandlockMode::On,
    }
}

/// A call no thread kind may make: a socket, an attacker's first step out.
fn forbidden_call() -> i64 {
    // SAFETY: socket(2) with constant arguments; the descriptor, if any, is closed.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    if fd >= 0 {
        // SAFETY: closing the descriptor just returned.
        unsafe { libc::close(fd) };
    }
    i64::from(fd)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pmo-sandbox-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The child's side: one case per process.
#[test]
fn child() {
    let Ok(case) = std::env::var(CASE) else {
        return;
    };
    // A SIGSYS kill would dump core; not here.
    let no_core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: setrlimit with a valid, initialised struct.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &no_core) };
    let parts: Vec<&str> = case.split(':').collect();
    match parts.as_slice() {
        ["forbidden", "main", mode] => {
            let sb = Sandbox::install(policy(mode)).unwrap();
            sb.confine_main(&[]).unwrap();
            say("before");
            let rc = forbidden_call();
            say(&format!("after {rc}"));
            finish()
        }
        ["forbidden", kind, mode] => {
            let kind = kind_by_name(kind).unwrap();
            let _sb = Sandbox::install(policy(mode)).unwrap();
            let t = threads::spawn(kind, "victim", || {
                // Ordinary work is fine: memory, a lock, the time.
                let v = vec![7u8; 1 << 20];
                let m = std::sync::Mutex::new(v.len());
                let _ = std::time::Instant::now();
                say(&format!("before {}", m.lock().unwrap()));
                let rc = forbidden_call();
                say(&format!("after {rc}"));
            })
            .unwrap();
            t.join().unwrap();
            finish()
        }
        ["ioctl", kind, request] => {
            let kind = kind_by_name(kind).unwrap();
            let request: u64 = request.parse().unwrap();
            let _sb = Sandbox::install(policy("on")).unwrap();
            threads::spawn(kind, "ioctl", move || {
                // SAFETY: an ioctl on an invalid descriptor: the kernel answers EBADF
                // unless the filter stops the call first.
                let rc = unsafe { libc::ioctl(-1, request as _, 0) };
                say(&format!("ioctl {rc}"));
            })
            .unwrap()
            .join()
            .unwrap();
            finish()
        }
        ["exec-memory", kind] => {
            let kind = kind_by_name(kind).unwrap();
            let _sb = Sandbox::install(policy("on")).unwrap();
            threads::spawn(kind, "jit", || {
                say("before");
                // SAFETY: an anonymous mapping, unmapped again if it is made.
                unsafe {
                    let p = libc::mmap(
                        std::ptr::null_mut(),
                        4096,
                        libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        -1,
                        0,
                    );
                    if p != libc::MAP_FAILED {
                        libc::munmap(p, 4096);
                    }
                }
                say("after");
            })
            .unwrap()
            .join()
            .unwrap();
            finish()
        }
        ["stacked"] => {
            // vCPU -> queue worker -> background detach, each under its creator's filters,
            // doing the detach's work on a file opened before the sandbox; then the main
            // thread, confined, starts one more detach at shutdown.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(scratch("stacked"))
                .unwrap();
            let file = std::sync::Arc::new(file);
            let sb = Sandbox::install(policy("on")).unwrap();
            let detach = |file: std::sync::Arc<std::fs::File>| {
                move || {
                    use std::os::unix::fs::FileExt;
                    file.write_all_at(&[1u8; 4096], 4096).unwrap();
                    file.sync_data().unwrap();
                    let mut b = [0u8; 16];
                    file.read_exact_at(&mut b, 4096).unwrap();
                    b[0]
                }
            };
            let f1 = file.clone();
            let got = threads::spawn(ThreadKind::Vcpu, "vcpu0", move || {
                threads::spawn(ThreadKind::PmoQueue, "virtio-pmo", move || {
                    threads::spawn(ThreadKind::PmoDetach, "pmo-detach-0", detach(f1))
                        .unwrap()
                        .join()
                        .unwrap()
                })
                .unwrap()
                .join()
                .unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
            assert_eq!(got, 1);
            sb.confine_main(&[]).unwrap();
            let got = threads::spawn(ThreadKind::PmoDetach, "pmo-detach-1", detach(file))
                .unwrap()
                .join()
                .unwrap();
            assert_eq!(got, 1);
            finish()
        }
        ["landlock"] => {
            let inside = scratch("inside");
            let outside = scratch("outside");
            std::fs::write(&inside, b"in").unwrap();
            std::fs::write(&outside, b"out").unwrap();
            let sb = Sandbox::install(Policy {
                seccomp: SeccompMode::Off,
                landlock: LandlockMode::Require,
            })
            .unwrap();
            // A thread started now: it may open nothing at all.
            let inside2 = inside.clone();
            let t = threads::spawn(ThreadKind::PmoQueue, "q", move || {
                std::fs::File::open(&inside2)
                    .map(|_| ())
                    .map_err(|e| e.kind())
            })
            .unwrap();
            assert_eq!(t.join().unwrap(), Err(std::io::ErrorKind::PermissionDenied));
            sb.confine_main(&[FileRule::read_write(&inside)]).unwrap();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&inside)
                .unwrap();
            assert!(f.as_raw_fd() >= 0);
            for denied in [outside.as_path(), std::path::Path::new("/etc/passwd")] {
                let e = std::fs::File::open(denied).unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{denied:?}");
            }
            // No new file next to the allowed one either.
            let e = std::fs::File::create(scratch("new")).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
            finish()
        }
        ["open", kind] => {
            let kind = kind_by_name(kind).unwrap();
            let _sb = Sandbox::install(Policy {
                seccomp: SeccompMode::On,
                landlock: LandlockMode::Off,
            })
            .unwrap();
            let r = threads::spawn(kind, "opener", || {
                std::fs::File::open("/etc/hostname")
                    .map(|_| ())
                    .map_err(|e| e.kind())
            })
            .unwrap()
            .join()
            .unwrap();
            assert_eq!(r, Err(std::io::ErrorKind::PermissionDenied));
            finish()
        }
        other => panic!("unknown case {other:?}"),
    }
}

#[test]
fn a_forbidden_call_kills_the_process_from_every_thread_kind_and_main() {
    let names = ThreadKind::ALL.iter().map(|k| k.name()).chain(["main"]);
    for name in names {
        let c = run(&format!("forbidden:{name}:on"));
        assert!(c.killed_by_sigsys(), "{name}: {:?}\n{}", c.status, c.text);
        assert!(
            c.text.contains("before"),
            "{name}: the thread never ran\n{}",
            c.text
        );
        assert!(!c.text.contains("after"), "{name}\n{}", c.text);
        let why = format!(
            "sandbox: a {name} thread made a forbidden system call {}",
            libc::SYS_socket
        );
        assert!(c.text.contains(&why), "{name}: no message\n{}", c.text);
    }
}

#[test]
fn in_log_mode_a_forbidden_call_goes_through() {
    for name in ThreadKind::ALL.iter().map(|k| k.name()).chain(["main"]) {
        let c = run(&format!("forbidden:{name}:log"));
        assert!(c.finished(), "{name}: {:?}\n{}", c.status, c.text);
        assert!(c.text.contains("after"), "{name}\n{}", c.text);
    }
}

#[test]
fn with_seccomp_off_nothing_is_filtered() {
    let c = run("forbidden:vcpu:off");
    assert!(c.finished(), "{:?}\n{}", c.status, c.text);
}

#[test]
fn ioctls_are_filtered_by_request_number() {
    const KVM_RUN: u64 = 0xae80;
    // A vCPU may enter the guest: the call reaches the kernel (EBADF on fd -1).
    let c = run(&format!("ioctl:vcpu:{KVM_RUN}"));
    assert!(
        c.finished() && c.text.contains("ioctl -1"),
        "{:?}\n{}",
        c.status,
        c.text
    );
    // A fault thread may not, nor any thread use a request nobody needs (TIOCSTI).
    let c = run(&format!("ioctl:pmo-fault:{KVM_RUN}"));
    assert!(c.killed_by_sigsys(), "{:?}\n{}", c.status, c.text);
    let c = run(&format!("ioctl:vcpu:{}", libc::TIOCSTI));
    assert!(c.killed_by_sigsys(), "{:?}\n{}", c.status, c.text);
}

#[test]
fn no_thread_maps_executable_memory() {
    for name in ["vcpu", "pmo-queue", "pmo-fault"] {
        let c = run(&format!("exec-memory:{name}"));
        assert!(c.killed_by_sigsys(), "{name}: {:?}\n{}", c.status, c.text);
        assert!(!c.text.contains("after"), "{name}");
    }
}

#[test]
fn threads_started_at_run_time_work_under_their_creators_filters() {
    let c = run("stacked");
    assert!(c.finished(), "{:?}\n{}", c.status, c.text);
}

#[test]
fn opening_a_file_fails_in_every_thread_kind() {
    for k in ThreadKind::ALL {
        let c = run(&format!("open:{}", k.name()));
        assert!(c.finished(), "{k}: {:?}\n{}", c.status, c.text);
    }
}

#[test]
fn landlock_allows_the_configured_files_and_nothing_else() {
    let c = run("landlock");
    assert!(c.finished(), "{:?}\n{}", c.status, c.text);
}
