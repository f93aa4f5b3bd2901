//! YCSB A-F on LMDB, driven from Rust: the `ycsb` crate's generator (the C implementation the
//! guest driver uses too) and `lmdb-pmo`'s environment, on a PMO or on an ordinary file.
//!
//! A run: the load phase inserts key numbers `0..records` (version 0, all fields) in write
//! transactions of `load_batch`; the run phase gives each of T threads its own generator
//! (thread `t` of `T`, `ops / T` operations) and cuts each thread's operations into `periods`
//! periods. In a period a thread's writes go into one write transaction that it commits at the
//! period's end (one psync: LPMO's "psync after every N operations"); its reads in the period
//! go through that transaction once it is open, else through a read transaction of their own
//! (LMDB allows one transaction per thread). Every `session` periods the environment is closed
//! and opened again: a detach and an attach of the PMO (LPMO: after 4 psyncs).
//!
//! Each thread appends its writes to a shared log just before its commit, while it still holds
//! LMDB's writer lock, so the log is in commit order and gives exactly what the database must
//! hold afterwards ([`expected`]); [`check`] compares every record (verified with the
//! generator's recomputable field bytes) with it.

use std::collections::HashMap;
use std::sync::Mutex;

use lmdb_pmo::{Env as Lmdb, RwTxn};
use locked::Locked;
use ycsb::{Generator, Op, OpKind, Options, Workload, FIELDS, FIELD_LEN, RECORD_LEN};

use super::AppError;

/// Sizes of a YCSB cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct YcsbScale {
    /// Records of the load phase (YCSB's `recordcount`).
    pub records: u64,
    /// Operations of the run phase over all threads (`operationcount`).
    pub ops: u64,
    /// Psync periods per thread over the run.
    pub periods: u64,
    /// Periods per attach session.
    pub session: u64,
    /// Seed of every generator.
    pub seed: u64,
    /// Inserts per write transaction in the load phase.
    pub load_batch: u64,
}

impl YcsbScale {
    /// The sizes of a full run (`quick`: a smoke test of a few hundred records). The full run
    /// keeps LPMO's cadence (seed 000 §8.1.3): a psync every 10,000 operations (each of T
    /// threads commits after its 10,000 / T), a detach and attach after every 4 psyncs; 80,000
    /// operations make 8 psyncs and 2 attach sessions.
    pub fn preset(quick: bool) -> YcsbScale {
        if quick {
            YcsbScale {
                records: 400,
                ops: 800,
                periods: 4,
                session: 2,
                seed: 1,
                load_batch: 100,
            }
        } else {
            YcsbScale {
                records: 10_000,
                ops: 80_000,
                periods: 8,
                session: 4,
                seed: 1,
                load_batch: 1000,
            }
        }
    }

    /// LMDB's map size, the PMO's size: 16 MiB plus a page per record (a 1000-byte record
    /// takes a third of a leaf page: the rest is room for one period's copy-on-write pages)
    /// and per 20 operations (the inserts of D and E are 5% of the operations).
    pub fn map_size(&self) -> usize {
        let pages = self.records + self.ops / 20;
        (16 << 20)
            + usize::try_from(pages)
                .unwrap_or(usize::MAX / 8)
                .saturating_mul(4096)
    }

    /// Operations one thread of `threads` runs in one period.
    fn period_ops(&self, threads: usize) -> u64 {
        (self.ops / threads.max(1) as u64 / self.periods.max(1)).max(1)
    }

    /// Operations a run with `threads` threads performs (whole periods).
    pub fn run_ops(&self, threads: usize) -> u64 {
        self.period_ops(threads) * self.periods.max(1) * threads.max(1) as u64
    }

    /// For reports.
    pub fn describe(&self) -> String {
        format!(
            "{} records of 1000 B, {} ops, a psync every {} ops, a detach every {} psyncs, map {} MiB",
            self.records,
            self.ops,
            self.ops / self.periods.max(1),
            self.session,
            self.map_size() >> 20
        )
    }
}

/// A committed write: the key number, the field (`None`: all) and the version it wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Write {
    /// The key number.
    pub keynum: u64,
    /// The field, or all of them.
    pub field: Option<usize>,
    /// The version stamped into the field bytes.
    pub version: u64,
}

/// The load phase: key numbers `0..records`, `load_batch` to a committed transaction.
pub fn load(env: &Lmdb, s: &YcsbScale) -> Result<(), AppError> {
    let mut k = 0;
    while k < s.records {
        let end = (k + s.load_batch.max(1)).min(s.records);
        let mut t = env.write_txn()?;
        for keynum in k..end {
            let op = Op::load(keynum);
            let rec = op.record().ok_or(AppError::Ycsb(ycsb::Error::BadRecord))?;
            t.put(op.key_bytes(), rec)?;
        }
        t.commit()?;
        k = end;
    }
    Ok(())
}

/// The run phase with `threads` threads; `open` opens the environment at the start of every
/// attach session (it is closed at the session's end). Returns the writes in commit order.
pub fn run(
    open: &dyn Fn() -> Result<Lmdb, AppError>,
    w: Workload,
    s: &YcsbScale,
    threads: usize,
) -> Result<Vec<Write>, AppError> {
    let threads = threads.max(1);
    let per_thread = s.ops / threads as u64;
    let t_count = u32::try_from(threads).map_err(|_| AppError::Params("threads".into()))?;
    let mut gens = (0..t_count)
        .map(|t| {
            Generator::with_options(
                w,
                s.records,
                s.seed,
                Options {
                    ops: per_thread,
                    thread: t,
                    threads: t_count,
                    write_all_fields: false,
                },
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let period_ops = s.period_ops(threads);
    let log = Mutex::new(Vec::new());
    let mut done = 0;
    let periods = s.periods.max(1);
    while done < periods {
        let n = (periods - done).min(s.session.max(1));
        let env = open()?;
        std::thread::scope(|sc| {
            let workers: Vec<_> = gens
                .iter_mut()
                .map(|g| {
                    let (env, log) = (&env, &log);
                    sc.spawn(move || -> Result<(), AppError> {
                        let mut buf = Vec::with_capacity(RECORD_LEN * 100);
                        for _ in 0..n {
                            period(env, g, period_ops, log, &mut buf)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|h| h.join().map_err(|_| AppError::Thread)?)
                .collect::<Result<Vec<()>, AppError>>()
        })?;
        drop(env);
        done += n;
    }
    Ok(log.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// One period of one thread: `n` operations, writes in one transaction committed at the end.
fn period(
    env: &Lmdb,
    g: &mut Generator,
    n: u64,
    log: &Mutex<Vec<Write>>,
    buf: &mut Vec<u8>,
) -> Result<(), AppError> {
    let mut txn: Option<RwTxn<'_>> = None;
    let mut mine = Vec::new();
    for _ in 0..n {
        let op = g.next_op();
        let key = op.key_bytes();
        let missing = || {
            AppError::Check(format!(
                "{} of a missing key {}",
                op.kind().name(),
                op.key()
            ))
        };
        match op.kind() {
            OpKind::Read => {
                buf.clear();
                let found = match &txn {
                    Some(t) => t.get(key)?.map(|v| buf.extend_from_slice(v)),
                    None => env.read_txn()?.get(key)?.map(|v| buf.extend_from_slice(v)),
                };
                found.ok_or_else(missing)?;
            }
            OpKind::Scan => {
                let len = op.scan_len().unwrap_or(1) as usize;
                buf.clear();
                let copy = |recs: Vec<lmdb_pmo::Record<'_>>, buf: &mut Vec<u8>| {
                    for (_, v) in recs {
                        buf.extend_from_slice(v);
                    }
                };
                match &txn {
                    Some(t) => copy(t.scan(key, len)?, buf),
                    None => {
                        let r = env.read_txn()?;
                        copy(r.scan(key, len)?, buf);
                    }
                }
                if buf.is_empty() {
                    return Err(missing());
                }
            }
            OpKind::Update | OpKind::ReadModifyWrite | OpKind::Insert => {
                let t = match txn {
                    Some(ref mut t) => t,
                    None => txn.insert(env.write_txn()?),
                };
                let field = op.field();
                let rec = match (op.kind(), field) {
                    (OpKind::Insert, _) | (_, None) => op
                        .record()
                        .ok_or(AppError::Ycsb(ycsb::Error::BadRecord))?
                        .to_vec(),
                    (_, Some(f)) => {
                        let mut rec = t.get(key)?.ok_or_else(missing)?.to_vec();
                        let v = op.value(f).ok_or(AppError::Ycsb(ycsb::Error::BadField))?;
                        rec.get_mut(f * FIELD_LEN..(f + 1) * FIELD_LEN)
                            .ok_or_else(|| {
                                AppError::Check(format!("record of {} is short", op.key()))
                            })?
                            .copy_from_slice(v);
                        rec
                    }
                };
                t.put(key, &rec)?;
                mine.push(Write {
                    keynum: op.keynum(),
                    field,
                    version: op.version(),
                });
            }
        }
    }
    if let Some(t) = txn {
        // Still holding LMDB's writer lock: the log is in commit order.
        log.locked().append(&mut mine);
        t.commit()?;
    }
    Ok(())
}

/// What the database must hold after the load and `writes`: each key number's field versions.
pub fn expected(s: &YcsbScale, writes: &[Write]) -> HashMap<u64, [u64; FIELDS]> {
    let mut m: HashMap<u64, [u64; FIELDS]> = (0..s.records).map(|k| (k, [0; FIELDS])).collect();
    for w in writes {
        let v = m.entry(w.keynum).or_insert([0; FIELDS]);
        match w.field {
            Some(f) => {
                if let Some(x) = v.get_mut(f) {
                    *x = w.version;
                }
            }
            None => *v = [w.version; FIELDS],
        }
    }
    m
}

/// Walks the whole database: every record must verify (its field bytes recomputed from their
/// header, its key the name of its key number) and carry exactly the versions `want` has for
/// it, and every key of `want` must be there.
pub fn check(env: &Lmdb, want: &HashMap<u64, [u64; FIELDS]>) -> Result<(), AppError> {
    let r = env.read_txn()?;
    let mut seen = 0usize;
    let mut start: Vec<u8> = Vec::new();
    loop {
        let batch = r.scan(&start, 1000)?;
        // Each batch after the first begins with the last key of the one before.
        let skip = usize::from(!start.is_empty());
        if batch.len() <= skip {
            break;
        }
        for (k, v) in &batch[skip..] {
            let name = String::from_utf8_lossy(k);
            let info = ycsb::check_record(k, v)
                .map_err(|_| AppError::Check(format!("record {name} does not verify")))?;
            match want.get(&info.keynum) {
                Some(versions) if *versions == info.versions => seen += 1,
                Some(versions) => {
                    return Err(AppError::Check(format!(
                        "record {name} has versions {:?}, expected {versions:?}",
                        info.versions
                    )))
                }
                None => return Err(AppError::Check(format!("record {name} was never written"))),
            }
        }
        start = batch[batch.len() - 1].0.to_vec();
    }
    if seen != want.len() {
        return Err(AppError::Check(format!(
            "{seen} records found, {} expected",
            want.len()
        )));
    }
    Ok(())
}
