//! The memory a pager serves: a private anonymous mapping, and the only place in the
//! workspace that changes its protection or drops its pages.

use std::io;

use crate::PAGE_SIZE;

/// A private anonymous mapping: the memory a userfaultfd pager registers
/// and a VMM maps into its guest (the PMO window, the CXL expander's DPA
/// space). Owns its pages; unmapped on drop.
pub struct AnonMap {
    addr: *mut libc::c_void,
    len: usize,
}

// SAFETY: plain memory. Owners use the address for ioctls, `protect` and `discard`, and copy
// pages with raw copies that tolerate concurrent guest writes; nothing holds references into it.
unsafe impl Send for AnonMap {}
// SAFETY: as above.
unsafe impl Sync for AnonMap {}

impl AnonMap {
    /// Maps `len` bytes, placed by the kernel, not reserved up front.
    pub fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping chosen by the kernel.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(AnonMap { addr, len })
    }

    /// Host address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: `mmap` refuses length 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pointer and length of `[addr, addr + len)` if it is a page-aligned range inside
    /// the mapping.
    fn range(&self, addr: u64, len: u64) -> io::Result<(*mut libc::c_void, usize)> {
        let start = self.addr();
        let inside = addr
            .checked_sub(start)
            .zip(addr.checked_add(len))
            .is_some_and(|(_, end)| end <= start + self.len as u64);
        if !inside || !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{addr:#x}+{len:#x} is not a page range of the mapping"),
            ));
        }
        // `inside` bounds both by the mapping's own address and length.
        Ok((addr as *mut libc::c_void, len as usize))
    }

    /// Changes the access of `[addr, addr + len)` (page aligned, inside the mapping). A page
    /// made inaccessible fails the access that touches it (KVM returns `EFAULT` to a vCPU)
    /// instead of faulting to the pager.
    pub fn protect(&self, addr: u64, len: u64, access: Access) -> io::Result<()> {
        let (ptr, len) = self.range(addr, len)?;
        let prot = match access {
            Access::None => libc::PROT_NONE,
            Access::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        };
        // SAFETY: the range lies inside our own mapping (checked above); only its protection
        // changes, and nothing holds references into it.
        if unsafe { libc::mprotect(ptr, len, prot) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Drops the pages of `[addr, addr + len)` (page aligned, inside the mapping): their
    /// contents are gone, and the next touch of each faults to the userfaultfd again.
    pub fn discard(&self, addr: u64, len: u64) -> io::Result<()> {
        let (ptr, len) = self.range(addr, len)?;
        // SAFETY: the range lies inside our own private anonymous mapping (checked above);
        // dropping its pages only makes them missing again.
        if unsafe { libc::madvise(ptr, len, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// What [`AnonMap::protect`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: reads and writes fail.
    None,
    /// Reads and writes, as mapped.
    ReadWrite,
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `new`.
        unsafe { libc::munmap(self.addr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protect_and_discard_only_whole_pages_of_the_mapping() {
        let m = AnonMap::new(4 * PAGE_SIZE as usize).unwrap();
        let base = m.addr();
        for (addr, len) in [
            (base - PAGE_SIZE, PAGE_SIZE),
            (base + 4 * PAGE_SIZE, PAGE_SIZE),
            (base + 3 * PAGE_SIZE, 2 * PAGE_SIZE),
            (base + 1, PAGE_SIZE),
            (base, PAGE_SIZE + 1),
            (u64::MAX - PAGE_SIZE + 1, PAGE_SIZE),
        ] {
            let e = m.discard(addr, len).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{addr:#x}+{len:#x}");
            let e = m.protect(addr, len, Access::None).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{addr:#x}+{len:#x}");
        }
        m.protect(base, 4 * PAGE_SIZE, Access::ReadWrite).unwrap();
    }

    #[test]
    fn discard_drops_the_contents() {
        let m = AnonMap::new(2 * PAGE_SIZE as usize).unwrap();
        let p = m.addr() as *mut u8;
        // SAFETY: both pages are inside our read-write mapping.
        unsafe {
            p.write_volatile(7);
            p.add(PAGE_SIZE as usize).write_volatile(9);
        }
        m.discard(m.addr(), PAGE_SIZE).unwrap();
        // SAFETY: as above; a dropped private anonymous page reads as zeros.
        let (a, b) = unsafe { (p.read_volatile(), p.add(PAGE_SIZE as usize).read_volatile()) };
        assert_eq!((a, b), (0, 9));
    }
}
