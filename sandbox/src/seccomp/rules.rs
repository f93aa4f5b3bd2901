//! Which system calls each thread kind may make: the allowlists, built from groups.
//!
//! Filters stack: a thread starts under every filter of the thread that created it, and
//! every installed filter must allow a call. So a thread that starts threads at run time
//! (a vCPU starts the queue workers at DRIVER_OK and runs the PMO device's reset; a queue
//! worker starts background detaches; the main thread detaches what is left at shutdown)
//! allows the union of its own calls and those of every kind it may start ([`spawns`]).
//! Threads started during setup (fault threads, prefetch worker, CXL mailbox and fault
//! threads, vCPUs) are started by the main thread before it is filtered and carry only
//! their own filter. `docs/sandbox.md` has the tables and why each call is there.

use std::collections::BTreeMap;

use libc::c_long;
use seccompiler::{BackendError, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
use threads::ThreadKind;

use super::ioctls;

/// Who a filter is for: a started thread's kind, or the VMM's main thread after setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// A thread started through `threads::spawn`.
    Thread(ThreadKind),
    /// The VMM's main thread once the machine is built (it waits, then tears down).
    Main,
}

impl Target {
    /// The target's name in messages and docs.
    pub fn name(self) -> &'static str {
        match self {
            Target::Thread(k) => k.name(),
            Target::Main => "main",
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Groups of calls that belong together; each kind is a set of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Every thread: memory (never executable), locks, time, sleeping, signals masks, logging
    /// (`write`), eventfd reads, closing fds, randomness, exit and `abort`.
    Common,
    /// Starting a thread at run time: the thread's start runs under its creator's filters,
    /// including the start hook that installs its own Landlock domain and filter.
    Spawn,
    /// Making eventfds and epoll sets (a queue worker's, at DRIVER_OK).
    MakeFds,
    /// Waiting on epoll sets (fault threads, queue workers).
    Epoll,
    /// userfaultfd installs, wakes and write-protect (the window's and the expander's pages).
    Uffd,
    /// Reading and writing media, store and LSA files at an offset; the media timing model.
    MediaIo,
    /// Making writes durable (psync, detach, pmem flush, GPF), punching holes, the store's
    /// memory check at attach, the crash tests' self-kill.
    MediaSync,
    /// Entering the guest.
    KvmRun,
    /// The VM's memory map and ioeventfds (BARs, decoders, working areas, DRIVER_OK).
    KvmVm,
    /// MSI interrupts into the guest.
    KvmMsi,
    /// Waiting for a signal (SIGTERM).
    SigWait,
}

/// The groups a kind's own work needs.
pub fn groups(target: Target) -> &'static [Group] {
    use Group::*;
    match target {
        Target::Thread(ThreadKind::Vcpu) => &[
            Common, Spawn, MakeFds, KvmRun, KvmVm, KvmMsi, Uffd, MediaIo, MediaSync,
        ],
        Target::Thread(ThreadKind::PmoQueue) => &[
            Common, Spawn, MakeFds, Epoll, Uffd, MediaIo, MediaSync, KvmVm, KvmMsi,
        ],
        Target::Thread(ThreadKind::PmemQueue) => &[Common, Epoll, MediaSync, KvmMsi],
        Target::Thread(ThreadKind::PmoFault) => &[Common, Epoll, Uffd, MediaIo],
        Target::Thread(ThreadKind::PmoPrefetch) => &[Common, Uffd, MediaIo],
        Target::Thread(ThreadKind::PmoDetach) => &[Common, Uffd, MediaIo, MediaSync],
        Target::Thread(ThreadKind::CxlMailbox) => &[Common, MediaIo, MediaSync],
        Target::Thread(ThreadKind::CxlFault) => &[Common, Epoll, Uffd, MediaIo, MediaSync],
        Target::Thread(ThreadKind::Signals) => &[Common, SigWait],
        Target::Thread(ThreadKind::ConsoleIn) => &[Common],
        Target::Main => &[Common, Spawn, Uffd, MediaIo, MediaSync, KvmVm, KvmMsi],
    }
}

/// The kinds a thread of `target` may start while it runs under its filter.
pub fn spawns(target: Target) -> &'static [ThreadKind] {
    match target {
        // DRIVER_OK starts a device's queue worker; the PMO device's reset detaches.
        Target::Thread(ThreadKind::Vcpu) => &[
            ThreadKind::PmoQueue,
            ThreadKind::PmemQueue,
            ThreadKind::PmoDetach,
        ],
        Target::Thread(ThreadKind::PmoQueue) | Target::Main => &[ThreadKind::PmoDetach],
        Target::Thread(_) => &[],
    }
}

/// An allowlist under construction: per call, any arguments (`None`) or one of some rules.
#[derive(Debug, Default)]
pub struct Allow {
    calls: BTreeMap<i64, Option<Vec<SeccompRule>>>,
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, BackendError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
}

/// Rules matching argument `arg` equal to any of `values` (32-bit compare: ioctl requests,
/// prctl options, flags).
fn arg_in(arg: u8, values: &[u64]) -> Result<Vec<SeccompRule>, BackendError> {
    values
        .iter()
        .map(|v| SeccompRule::new(vec![cond(arg, SeccompCmpOp::Eq, *v)?]))
        .collect()
}

impl Allow {
    /// Allows each call in `calls` with any arguments.
    fn any(&mut self, calls: &[c_long]) {
        for c in calls {
            self.calls.insert(*c, None);
        }
    }

    /// Allows `call` when one of `rules` matches (added to rules already there).
    fn when(&mut self, call: c_long, rules: Vec<SeccompRule>) {
        // `None`: already allowed with any arguments.
        if let Some(v) = self.calls.entry(call).or_insert_with(|| Some(Vec::new())) {
            v.extend(rules);
        }
    }

    /// Whether `call` is allowed with some arguments.
    pub fn contains(&self, call: c_long) -> bool {
        self.calls.contains_key(&call)
    }

    /// The calls allowed, for docs and tests.
    pub fn calls(&self) -> impl Iterator<Item = i64> + '_ {
        self.calls.keys().copied()
    }

    /// The rule map seccompiler compiles: an empty rule list matches any arguments.
    pub fn into_rules(self) -> BTreeMap<i64, Vec<SeccompRule>> {
        self.calls
            .into_iter()
            .map(|(c, r)| (c, r.unwrap_or_default()))
            .collect()
    }

    fn add(&mut self, group: Group, pid: u32) -> Result<(), BackendError> {
        let no_exec = || -> Result<Vec<SeccompRule>, BackendError> {
            Ok(vec![SeccompRule::new(vec![cond(
                2,
                SeccompCmpOp::MaskedEq(libc::PROT_EXEC as u64),
                0,
            )?])?])
        };
        match group {
            Group::Common => {
                self.any(&[
                    libc::SYS_futex,
                    libc::SYS_sched_yield,
                    libc::SYS_sched_getaffinity,
                    libc::SYS_clock_gettime,
                    libc::SYS_clock_getres,
                    libc::SYS_gettimeofday,
                    libc::SYS_clock_nanosleep,
                    libc::SYS_nanosleep,
                    libc::SYS_munmap,
                    libc::SYS_mremap,
                    libc::SYS_madvise,
                    libc::SYS_brk,
                    libc::SYS_rt_sigprocmask,
                    libc::SYS_rt_sigreturn,
                    libc::SYS_sigaltstack,
                    libc::SYS_getpid,
                    libc::SYS_gettid,
                    libc::SYS_exit,
                    libc::SYS_exit_group,
                    libc::SYS_restart_syscall,
                    libc::SYS_read,
                    libc::SYS_write,
                    libc::SYS_writev,
                    libc::SYS_close,
                    libc::SYS_getcpu,
                    libc::SYS_getrandom,
                    // Made to fail with EACCES by the errno filter (never reaches a file):
                    // glibc's malloc opens /sys/devices/system/cpu/online when a thread
                    // makes its first arena, and falls back when that fails.
                    libc::SYS_openat,
                ]);
                // Memory is never made executable: no injected code runs.
                self.when(libc::SYS_mmap, no_exec()?);
                self.when(libc::SYS_mprotect, no_exec()?);
                // abort() signals its own process; nothing else is signalled.
                self.when(
                    libc::SYS_tgkill,
                    vec![SeccompRule::new(vec![cond(
                        0,
                        SeccompCmpOp::Eq,
                        u64::from(pid),
                    )?])?],
                );
                // std checks that a descriptor it drops is open (debug builds).
                self.when(libc::SYS_fcntl, arg_in(1, &[libc::F_GETFD as u64])?);
            }
            Group::Spawn => {
                // Threads only (CLONE_THREAD set): no new process.
                self.when(
                    libc::SYS_clone,
                    vec![SeccompRule::new(vec![cond(
                        0,
                        SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
                        libc::CLONE_THREAD as u64,
                    )?])?],
                );
                // clone3's flags are in memory a filter cannot read: the errno filter makes
                // it fail with ENOSYS, and glibc falls back to clone.
                self.any(&[
                    libc::SYS_clone3,
                    libc::SYS_set_robust_list,
                    libc::SYS_rseq,
                    libc::SYS_landlock_create_ruleset,
                    libc::SYS_landlock_restrict_self,
                ]);
                self.when(
                    libc::SYS_prctl,
                    arg_in(
                        0,
                        &[libc::PR_SET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64],
                    )?,
                );
                self.when(
                    libc::SYS_seccomp,
                    arg_in(0, &[u64::from(libc::SECCOMP_SET_MODE_FILTER)])?,
                );
            }
            Group::MakeFds => {
                self.any(&[libc::SYS_epoll_create1, libc::SYS_eventfd2]);
                self.when(libc::SYS_fcntl, arg_in(1, &[libc::F_DUPFD_CLOEXEC as u64])?);
            }
            Group::Epoll => self.any(&[
                libc::SYS_epoll_wait,
                libc::SYS_epoll_pwait,
                libc::SYS_epoll_ctl,
            ]),
            Group::Uffd => self.when(
                libc::SYS_ioctl,
                arg_in(
                    1,
                    &[
                        ioctls::UFFDIO_COPY,
                        ioctls::UFFDIO_ZEROPAGE,
                        ioctls::UFFDIO_WAKE,
                        ioctls::UFFDIO_WRITEPROTECT,
                    ],
                )?,
            ),
            Group::MediaIo => {
                self.any(&[
                    libc::SYS_pread64,
                    libc::SYS_pwrite64,
                    libc::SYS_preadv,
                    libc::SYS_pwritev,
                ]);
                self.when(
                    libc::SYS_prctl,
                    arg_in(0, &[libc::PR_SET_TIMERSLACK as u64])?,
                );
            }
            Group::MediaSync => {
                self.any(&[
                    libc::SYS_fdatasync,
                    libc::SYS_fsync,
                    libc::SYS_msync,
                    libc::SYS_fallocate,
                    libc::SYS_sysinfo,
                ]);
                // The crash tests' persist point kills its own process, nothing else.
                self.when(
                    libc::SYS_kill,
                    vec![SeccompRule::new(vec![
                        cond(0, SeccompCmpOp::Eq, u64::from(pid))?,
                        cond(1, SeccompCmpOp::Eq, libc::SIGKILL as u64)?,
                    ])?],
                );
            }
            Group::KvmRun => self.when(libc::SYS_ioctl, arg_in(1, &[ioctls::KVM_RUN])?),
            Group::KvmVm => self.when(
                libc::SYS_ioctl,
                arg_in(
                    1,
                    &[
                        ioctls::KVM_SET_USER_MEMORY_REGION,
                        ioctls::KVM_IOEVENTFD,
                        ioctls::KVM_IRQFD,
                    ],
                )?,
            ),
            Group::KvmMsi => self.when(libc::SYS_ioctl, arg_in(1, &[ioctls::KVM_SIGNAL_MSI])?),
            Group::SigWait => self.any(&[libc::SYS_rt_sigtimedwait]),
        }
        Ok(())
    }
}

/// The allowlist of `target`: its own groups and those of every kind it may start, and of
/// the kinds those may start (`pid`: this process, the only one a thread may signal).
pub fn allowlist(target: Target, pid: u32) -> Result<Allow, BackendError> {
    let mut allow = Allow::default();
    let mut todo = vec![target];
    let mut seen = Vec::new();
    while let Some(t) = todo.pop() {
        if seen.contains(&t) {
            continue;
        }
        seen.push(t);
        for g in groups(t) {
            allow.add(*g, pid)?;
        }
        todo.extend(spawns(t).iter().map(|k| Target::Thread(*k)));
    }
    Ok(allow)
}
