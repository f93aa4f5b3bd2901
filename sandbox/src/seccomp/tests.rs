use super::rules::{allowlist, spawns, Target};
use super::*;

fn targets() -> Vec<Target> {
    ThreadKind::ALL
        .iter()
        .map(|k| Target::Thread(*k))
        .chain([Target::Main])
        .collect()
}

#[test]
fn filters_compile_in_both_modes() {
    for mode in [SeccompMode::On, SeccompMode::Log] {
        let f = Filters::new(mode).unwrap();
        for t in targets() {
            assert!(f.allow.get(&t).is_some_and(|p| !p.is_empty()), "{t}");
        }
        assert_eq!(f.errno.len(), 2);
    }
}

/// Filters stack: a thread started at run time runs under its creator's filter too, so the
/// creator must allow every call the started kind may make.
#[test]
fn a_spawner_allows_everything_its_children_do() {
    for t in targets() {
        let own: Vec<i64> = allowlist(t, 1).unwrap().calls().collect();
        for k in spawns(t) {
            for call in allowlist(Target::Thread(*k), 1).unwrap().calls() {
                assert!(
                    own.contains(&call),
                    "{t} starts {k} but forbids call {call}"
                );
            }
        }
    }
}

#[test]
fn no_kind_may_execute_connect_trace_or_reach_other_processes() {
    let never = [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_socket,
        libc::SYS_connect,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_open_by_handle_at,
        libc::SYS_mount,
        libc::SYS_setuid,
        libc::SYS_unlink,
        libc::SYS_unlinkat,
        libc::SYS_renameat2,
        libc::SYS_mkdirat,
        libc::SYS_chmod,
        libc::SYS_fchmod,
        libc::SYS_pkey_mprotect,
        libc::SYS_memfd_create,
        libc::SYS_userfaultfd,
        libc::SYS_bpf,
        super::trap::DEATH_CALL,
    ];
    for t in targets() {
        let a = allowlist(t, 1).unwrap();
        for call in never {
            assert!(!a.contains(call), "{t} allows call {call}");
        }
    }
}

#[test]
fn only_vcpus_enter_the_guest_and_only_spawners_clone() {
    for t in targets() {
        let a = allowlist(t, 1).unwrap();
        let spawner = !spawns(t).is_empty();
        assert_eq!(a.contains(libc::SYS_clone), spawner, "{t}");
        assert_eq!(a.contains(libc::SYS_seccomp), spawner, "{t}");
    }
    // Fault threads, the prefetch worker, the mailbox and the signal and console threads
    // make no KVM call and no new descriptors.
    for k in [
        ThreadKind::PmoFault,
        ThreadKind::PmoPrefetch,
        ThreadKind::CxlMailbox,
        ThreadKind::CxlFault,
        ThreadKind::Signals,
        ThreadKind::ConsoleIn,
    ] {
        let a = allowlist(Target::Thread(k), 1).unwrap();
        assert!(!a.contains(libc::SYS_eventfd2), "{k}");
        assert!(!a.contains(libc::SYS_epoll_create1), "{k}");
    }
    let c = allowlist(Target::Thread(ThreadKind::ConsoleIn), 1).unwrap();
    assert!(!c.contains(libc::SYS_ioctl));
}
