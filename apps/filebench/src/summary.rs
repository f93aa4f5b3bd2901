//! What a run did: per-flowop numbers, PMO traffic, and the report in Filebench's form or as
//! CSV.

use std::ffi::{c_char, c_int};
use std::fmt;

use crate::config::Personality;
use crate::ffi::{self, c_text};

/// Whether a flowop reads, writes or neither (Filebench's read/write attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// readwholefile.
    Read,
    /// writewholefile, appendfilerand.
    Write,
    /// Everything else (create, open, close, fsync, delete, stat).
    Other,
}

/// One flowop's numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowopStats {
    /// Filebench's flowop name, e.g. "appendfilerand2".
    pub name: String,
    /// Read, write or other.
    pub kind: Kind,
    /// Executions.
    pub ops: u64,
    /// Bytes read or written.
    pub bytes: u64,
    /// Total latency.
    pub ns: u64,
    /// Shortest latency.
    pub min_ns: u64,
    /// Longest latency.
    pub max_ns: u64,
}

/// PMO traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Objects created.
    pub creates: u64,
    /// Objects destroyed.
    pub destroys: u64,
    /// Attachments.
    pub attaches: u64,
    /// Detaches.
    pub detaches: u64,
    /// Syncs (psyncs).
    pub psyncs: u64,
    /// Bytes read by readwholefile.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Writes cut at the file's capacity.
    pub truncated_writes: u64,
    /// Bytes those writes did not write.
    pub truncated_bytes: u64,
    /// Flowops that waited for an eligible entry.
    pub pick_waits: u64,
    /// Lengths or data found other than written.
    pub verify_errors: u64,
}

impl From<&ffi::FbCounters> for Counters {
    fn from(c: &ffi::FbCounters) -> Self {
        Self {
            creates: c.creates,
            destroys: c.destroys,
            attaches: c.attaches,
            detaches: c.detaches,
            psyncs: c.psyncs,
            bytes_read: c.bytes_read,
            bytes_written: c.bytes_written,
            truncated_writes: c.truncated_writes,
            truncated_bytes: c.truncated_bytes,
            pick_waits: c.pick_waits,
            verify_errors: c.verify_errors,
        }
    }
}

/// What a run did.
#[derive(Clone)]
pub struct Summary {
    /// The personality.
    pub personality: Personality,
    /// Worker threads.
    pub nthreads: u32,
    /// Entries of the main fileset.
    pub nfiles: u32,
    /// Whole passes over the flowop list.
    pub loops: u64,
    /// Duration of the run (not of the preparation).
    pub elapsed_ns: u64,
    /// PMO traffic of the run.
    pub run: Counters,
    /// PMO traffic of the preparation (creating the prealloc'ed files).
    pub prepare: Counters,
    /// Main-fileset files existing after the run.
    pub files_at_end: u64,
    /// Their total length.
    pub bytes_at_end: u64,
    /// Per flowop, in the personality's order.
    pub flowops: Vec<FlowopStats>,
    raw: Box<ffi::FbResult>,
}

impl fmt::Debug for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Summary")
            .field("personality", &self.personality)
            .field("loops", &self.loops)
            .field("run", &self.run)
            .field("prepare", &self.prepare)
            .field("flowops", &self.flowops)
            .finish_non_exhaustive()
    }
}

impl Summary {
    pub(crate) fn from_raw(personality: Personality, raw: Box<ffi::FbResult>) -> Self {
        let n = (raw.nflowops as usize).min(ffi::MAX_FLOWOPS);
        let flowops = raw.flowops[..n]
            .iter()
            .map(|s| FlowopStats {
                name: c_text(&s.name),
                kind: match s.kind {
                    1 => Kind::Read,
                    2 => Kind::Write,
                    _ => Kind::Other,
                },
                ops: s.ops,
                bytes: s.bytes,
                ns: s.ns,
                min_ns: s.min_ns,
                max_ns: s.max_ns,
            })
            .collect();
        Self {
            personality,
            nthreads: raw.nthreads,
            nfiles: raw.nfiles,
            loops: raw.loops,
            elapsed_ns: raw.elapsed_ns,
            run: Counters::from(&raw.run),
            prepare: Counters::from(&raw.prepare),
            files_at_end: raw.files_at_end,
            bytes_at_end: raw.bytes_at_end,
            flowops,
            raw,
        }
    }

    /// Executions of write flowops and of read-or-write flowops: the measured write share.
    pub fn write_share(&self) -> (u64, u64) {
        let count = |k: Kind| -> u64 {
            self.flowops
                .iter()
                .filter(|s| s.kind == k)
                .map(|s| s.ops)
                .sum()
        };
        let writes = count(Kind::Write);
        (writes, writes + count(Kind::Read))
    }

    fn format(&self, csv: bool) -> String {
        // SAFETY: a valid result; NULL/0 asks for the length only.
        let n = unsafe { ffi::fb_format(&*self.raw, c_int::from(csv), std::ptr::null_mut(), 0) };
        let mut buf = vec![0 as c_char; n + 1];
        // SAFETY: `buf` has n + 1 writable bytes, enough for the text and its NUL.
        unsafe { ffi::fb_format(&*self.raw, c_int::from(csv), buf.as_mut_ptr(), buf.len()) };
        c_text(&buf)
    }

    /// The result as Filebench prints it: a line per flowop (ops, ops/s, mb/s, ms/op), the IO
    /// Summary line, and the PMO counters of the run and the preparation.
    pub fn report(&self) -> String {
        self.format(false)
    }

    /// The result as CSV: a header, a row per flowop, an "IO Summary" and a "prepare" row.
    pub fn csv(&self) -> String {
        self.format(true)
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.report())
    }
}
