//! A minimal writer of `newc` cpio archives, the format the Linux kernel unpacks as an
//! initramfs.
//!
//! Why our own: the runner appends a per-run payload (the VMM binary, its libraries, the guest
//! image, the job script) to the test host's base initramfs. Writing the archive directly
//! avoids copying tens of MB into a staging tree for the `cpio` tool.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read as _, Write};
use std::path::Path;

/// Streams entries into a newc archive. Parent directories are emitted automatically, since
/// the kernel's unpacker does not create them for a file.
pub struct CpioWriter<W: Write> {
    out: W,
    written: u64,
    next_ino: u32,
    dirs: BTreeSet<String>,
}

impl<W: Write> CpioWriter<W> {
    /// A writer into `out`.
    pub fn new(out: W) -> Self {
        CpioWriter {
            out,
            written: 0,
            next_ino: 1,
            dirs: BTreeSet::new(),
        }
    }

    fn header(&mut self, name: &str, mode: u32, nlink: u32, size: u64) -> io::Result<()> {
        let size = u32::try_from(size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file over 4 GiB for cpio"))?;
        let namesize = name.len() + 1;
        let ino = self.next_ino;
        self.next_ino += 1;
        let hdr = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{size:08x}{:08x}{:08x}{:08x}{:08x}{namesize:08x}{:08x}",
            0, 0, 0, 0, 0, 0, 0, 0
        );
        self.put(hdr.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()
    }

    fn put(&mut self, data: &[u8]) -> io::Result<()> {
        self.out.write_all(data)?;
        self.written += data.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..n])
    }

    fn parents(&mut self, path: &str) -> io::Result<()> {
        let mut acc = String::new();
        let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        for c in comps.iter().take(comps.len().saturating_sub(1)) {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(c);
            if self.dirs.insert(acc.clone()) {
                let name = acc.clone();
                self.header(&name, 0o040755, 2, 0)?;
            }
        }
        Ok(())
    }

    /// Adds a regular file at `path` (relative to the archive root) with `data`.
    pub fn add_bytes(&mut self, path: &str, mode: u32, data: &[u8]) -> io::Result<()> {
        let path = path.trim_start_matches('/');
        self.parents(path)?;
        self.header(path, 0o100000 | (mode & 0o7777), 1, data.len() as u64)?;
        self.put(data)?;
        self.pad()
    }

    /// Adds the host file `src` (symlinks followed) at `path` with `mode`.
    pub fn add_file(&mut self, path: &str, mode: u32, src: &Path) -> io::Result<()> {
        let path = path.trim_start_matches('/');
        let mut f = File::open(src)?;
        let len = f.metadata()?.len();
        self.parents(path)?;
        self.header(path, 0o100000 | (mode & 0o7777), 1, len)?;
        let copied = io::copy(&mut (&mut f).take(len), &mut self.out)?;
        if copied != len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while archiving", src.display()),
            ));
        }
        self.written += copied;
        self.pad()
    }

    /// Writes the trailer and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 1, 0)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    #[test]
    fn cpio_tool_reads_what_we_write() {
        let mut w = CpioWriter::new(Vec::new());
        w.add_bytes("/job/run.sh", 0o755, b"echo hi\n").unwrap();
        w.add_bytes("a/b/c.txt", 0o644, b"xyz").unwrap();
        let data = w.finish().unwrap();
        assert_eq!(data.len() % 4, 0);
        let Ok(mut child) = Command::new("cpio")
            .args(["-t", "--quiet"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
        else {
            panic!("cpio not installed: run scripts/setup.sh");
        };
        child.stdin.take().unwrap().write_all(&data).unwrap();
        let out = child.wait_with_output().unwrap();
        let list = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            list.lines().collect::<Vec<_>>(),
            ["job", "job/run.sh", "a", "a/b", "a/b/c.txt"]
        );
    }
}
