//! One thread per active device that waits for queue notifications.
//!
//! The thread sleeps in epoll on the queues' ioeventfds plus a kill eventfd;
//! dropping the [`QueueWorker`] (driver reset, VMM shutdown) wakes it and joins it,
//! so a device never outlives its owner's view of the queues.

use std::io;
use std::os::fd::AsRawFd;
use threads::{JoinHandle, ThreadKind};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Errors starting a worker thread.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The epoll set could not be created or filled.
    #[error("epoll: {0}")]
    Epoll(io::Error),
    /// The stop eventfd could not be created.
    #[error("eventfd: {0}")]
    EventFd(io::Error),
    /// The thread could not be spawned.
    #[error("spawn thread: {0}")]
    Spawn(io::Error),
}

/// Called on the worker thread each time the driver notifies a queue.
pub trait QueueHandler: Send + 'static {
    /// Serves every available chain of queue `index` (its notification was just consumed).
    fn process_queue(&mut self, index: u16);
}

/// RAII owner of a device's queue thread.
pub struct QueueWorker {
    kill: EventFd,
    thread: Option<JoinHandle<()>>,
}

const KILL_TOKEN: u64 = u64::MAX;

impl QueueWorker {
    /// Starts a thread that calls `handler.process_queue(i)` when `notifies[i].1` fires.
    pub fn spawn<H: QueueHandler>(
        kind: ThreadKind,
        name: &str,
        notifies: Vec<(u16, EventFd)>,
        mut handler: H,
    ) -> Result<Self, WorkerError> {
        let epoll = Epoll::new().map_err(WorkerError::Epoll)?;
        let kill = EventFd::new(EFD_NONBLOCK).map_err(WorkerError::EventFd)?;
        epoll
            .ctl(
                ControlOperation::Add,
                kill.as_raw_fd(),
                EpollEvent::new(EventSet::IN, KILL_TOKEN),
            )
            .map_err(WorkerError::Epoll)?;
        for (index, fd) in &notifies {
            epoll
                .ctl(
                    ControlOperation::Add,
                    fd.as_raw_fd(),
                    EpollEvent::new(EventSet::IN, u64::from(*index)),
                )
                .map_err(WorkerError::Epoll)?;
        }
        let thread_kill = kill.try_clone().map_err(WorkerError::EventFd)?;
        let thread = threads::spawn(kind, name, move || {
            let mut events = vec![EpollEvent::default(); notifies.len() + 1];
            loop {
                let n = match epoll.wait(-1, &mut events) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::error!("queue worker epoll failed: {e}");
                        return;
                    }
                };
                for ev in &events[..n] {
                    if ev.data() == KILL_TOKEN {
                        let _ = thread_kill.read();
                        return;
                    }
                    let index = ev.data() as u16;
                    if let Some((_, fd)) = notifies.iter().find(|(i, _)| *i == index) {
                        // Drain the counter; a failure only means nothing was pending.
                        let _ = fd.read();
                    }
                    handler.process_queue(index);
                }
            }
        })
        .map_err(WorkerError::Spawn)?;
        Ok(QueueWorker {
            kill,
            thread: Some(thread),
        })
    }
}

impl Drop for QueueWorker {
    fn drop(&mut self) {
        if let Err(e) = self.kill.write(1) {
            log::error!("cannot stop queue worker: {e}");
            return;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    struct Echo(mpsc::Sender<u16>);
    impl QueueHandler for Echo {
        fn process_queue(&mut self, index: u16) {
            let _ = self.0.send(index);
        }
    }

    #[test]
    fn notifications_reach_the_handler_and_drop_joins() {
        let a = EventFd::new(EFD_NONBLOCK).unwrap();
        let b = EventFd::new(EFD_NONBLOCK).unwrap();
        let (tx, rx) = mpsc::channel();
        let worker = QueueWorker::spawn(
            ThreadKind::PmemQueue,
            "test",
            vec![(0, a.try_clone().unwrap()), (1, b.try_clone().unwrap())],
            Echo(tx),
        )
        .unwrap();
        b.write(1).unwrap();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(),
            1
        );
        a.write(1).unwrap();
        assert_eq!(
            rx.recv_timeout(std::time::Duration::from_secs(5)).unwrap(),
            0
        );
        drop(worker);
        // The handler (and its sender) died with the thread.
        assert!(rx.recv().is_err());
    }
}
