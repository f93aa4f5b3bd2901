use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

/// Runs the test `name` of this binary in a child process with `THREADS_TEST_CHILD` set (the
/// hook is process-wide and settable once) and asserts it passed.
fn in_child(name: &str) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("THREADS_TEST_CHILD", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {name} failed:\n{text}");
    assert!(
        text.contains("1 passed"),
        "child {name} ran no test:\n{text}"
    );
}

fn is_child() -> bool {
    std::env::var_os("THREADS_TEST_CHILD").is_some()
}

#[test]
fn without_a_hook_a_spawn_is_a_plain_named_thread() {
    let t = spawn(ThreadKind::PmoFault, "plain0", || {
        std::thread::current().name().map(str::to_string)
    })
    .unwrap();
    assert_eq!(t.thread().name(), Some("plain0"));
    assert_eq!(t.join().unwrap().as_deref(), Some("plain0"));
}

#[test]
fn a_panicking_thread_joins_with_its_panic() {
    let t = spawn(ThreadKind::Vcpu, "panics", || -> u8 { panic!("boom") }).unwrap();
    assert!(t.join().is_err());
}

#[test]
fn the_hook_runs_inside_each_new_thread_before_its_work() {
    in_child("tests::child_hook_runs_inside_the_thread");
}

#[test]
fn child_hook_runs_inside_the_thread() {
    if !is_child() {
        return;
    }
    static SEEN: Mutex<Vec<(ThreadKind, Option<String>)>> = Mutex::new(Vec::new());
    set_start_hook(|kind| {
        let name = std::thread::current().name().map(str::to_string);
        SEEN.lock().unwrap().push((kind, name));
        Ok(())
    })
    .unwrap();
    assert!(hook_is_set());
    let t = spawn(ThreadKind::CxlMailbox, "mbox", || {
        // The hook already ran when the work starts.
        SEEN.lock().unwrap().len()
    })
    .unwrap();
    assert_eq!(t.join().unwrap(), 1);
    assert_eq!(
        SEEN.lock().unwrap().clone(),
        vec![(ThreadKind::CxlMailbox, Some("mbox".to_string()))]
    );
    assert!(matches!(
        set_start_hook(|_| Ok(())),
        Err(ThreadsError::HookAlreadySet)
    ));
}

#[test]
fn a_failing_hook_fails_the_spawn_and_the_work_never_runs() {
    in_child("tests::child_failing_hook_fails_closed");
}

#[test]
fn child_failing_hook_fails_closed() {
    if !is_child() {
        return;
    }
    set_start_hook(|kind| {
        if kind == ThreadKind::PmoDetach {
            Err("no filter for this kind".into())
        } else {
            Ok(())
        }
    })
    .unwrap();
    static RAN: AtomicBool = AtomicBool::new(false);
    let err = spawn(ThreadKind::PmoDetach, "detach-7", || {
        RAN.store(true, Ordering::SeqCst)
    })
    .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    let msg = err.to_string();
    assert!(
        msg.contains("detach-7") && msg.contains("no filter for this kind"),
        "{msg}"
    );
    assert!(!RAN.load(Ordering::SeqCst));
    // Other kinds still start.
    assert_eq!(
        spawn(ThreadKind::Vcpu, "v", || 5).unwrap().join().unwrap(),
        5
    );
}

#[test]
fn a_hook_set_after_an_unhooked_spawn_is_refused() {
    in_child("tests::child_hook_after_spawn_is_refused");
}

#[test]
fn child_hook_after_spawn_is_refused() {
    if !is_child() {
        return;
    }
    spawn(ThreadKind::Signals, "early", || ())
        .unwrap()
        .join()
        .unwrap();
    assert!(matches!(
        set_start_hook(|_| Ok(())),
        Err(ThreadsError::SpawnedBeforeHook(1))
    ));
    assert!(!hook_is_set());
}

#[test]
fn kinds_have_distinct_names() {
    let mut names: Vec<_> = ThreadKind::ALL.iter().map(|k| k.name()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ThreadKind::ALL.len());
}
