//! A p_malloc-like heap laid out inside the PMO's own bytes.
//!
//! The workloads keep their arrays in the PMO and find them again by offset after every
//! re-attach (the window slice may move), as a libpmo program does with `p_malloc` and its root
//! object. The layout mirrors guest/libpmo's in spirit: a header at offset 0 with a magic, the
//! heap bounds and the root (here: the table of allocations), then 16-byte aligned blocks, each
//! behind a 16-byte block header. There is no `p_free`: the workloads allocate once.
//!
//! Everything read back from the PMO is validated, so a pager that served a wrong page shows up
//! as an error, never as a panic or an out-of-bounds access.

/// "PMOHEAP1", little endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"PMOHEAP1");
/// Marks a block header.
const BLOCK_MAGIC: u64 = u64::from_le_bytes(*b"PMOBLOCK");
/// Bytes reserved at offset 0 for the heap header and the allocation table.
pub const HEADER: usize = 4096;
/// Size of a block header.
const BLOCK_HEADER: usize = 16;
/// Block alignment.
const ALIGN: usize = 16;
/// Most allocations the table holds.
pub const MAX_ALLOCS: usize = 16;

/// Errors of the in-PMO heap.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeapError {
    /// The PMO cannot hold the heap header and allocation table.
    #[error("PMO of {0} bytes is too small for a heap")]
    TooSmall(usize),
    /// The PMO does not start with a heap header: never formatted, or overwritten.
    #[error("no heap header (bad magic)")]
    BadMagic,
    /// The free space after the last allocation is smaller than the request.
    #[error("heap full: {0} more bytes do not fit")]
    Full(usize),
    /// Every slot of the allocation table is in use.
    #[error("allocation table full")]
    TableFull,
    /// The index names a free table slot or one past the table.
    #[error("allocation {0} does not exist")]
    NoSuch(usize),
    /// The table entry points outside the PMO or overlaps the header.
    #[error("allocation {0} is damaged")]
    Damaged(usize),
    /// The allocation cannot be viewed as `f32`s.
    #[error("allocation {0} is not aligned for f32 or not a whole number of them")]
    Misaligned(usize),
}

fn get(mem: &[u8], off: usize) -> Option<u64> {
    let b = mem.get(off..off.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

fn put(mem: &mut [u8], off: usize, v: u64) -> Option<()> {
    mem.get_mut(off..off.checked_add(8)?)?
        .copy_from_slice(&v.to_le_bytes());
    Some(())
}

// Header fields (byte offsets).
const H_MAGIC: usize = 0;
const H_END: usize = 8;
const H_NEXT: usize = 16;
const H_COUNT: usize = 24;
const H_TABLE: usize = 32;

/// Formats a fresh heap over `mem` (the whole PMO).
pub fn format(mem: &mut [u8]) -> Result<(), HeapError> {
    if mem.len() < HEADER + BLOCK_HEADER {
        return Err(HeapError::TooSmall(mem.len()));
    }
    mem[..HEADER].fill(0);
    let end = mem.len() as u64;
    put(mem, H_MAGIC, MAGIC).ok_or(HeapError::TooSmall(mem.len()))?;
    put(mem, H_END, end).ok_or(HeapError::TooSmall(mem.len()))?;
    put(mem, H_NEXT, HEADER as u64).ok_or(HeapError::TooSmall(mem.len()))?;
    put(mem, H_COUNT, 0).ok_or(HeapError::TooSmall(mem.len()))?;
    Ok(())
}

/// Allocates `len` bytes; returns the allocation's index in the table (its handle).
pub fn p_malloc(mem: &mut [u8], len: usize) -> Result<usize, HeapError> {
    check_magic(mem)?;
    let next = get(mem, H_NEXT).ok_or(HeapError::BadMagic)? as usize;
    let count = get(mem, H_COUNT).ok_or(HeapError::BadMagic)? as usize;
    if count >= MAX_ALLOCS {
        return Err(HeapError::TableFull);
    }
    let data = next
        .checked_add(BLOCK_HEADER)
        .map(|d| d.next_multiple_of(ALIGN))
        .ok_or(HeapError::Full(len))?;
    let end = data.checked_add(len).ok_or(HeapError::Full(len))?;
    if end > mem.len() {
        return Err(HeapError::Full(len));
    }
    put(mem, data - BLOCK_HEADER, BLOCK_MAGIC).ok_or(HeapError::Full(len))?;
    put(mem, data - BLOCK_HEADER + 8, len as u64).ok_or(HeapError::Full(len))?;
    put(mem, H_TABLE + count * 8, data as u64).ok_or(HeapError::TableFull)?;
    put(mem, H_COUNT, count as u64 + 1).ok_or(HeapError::TableFull)?;
    put(mem, H_NEXT, end as u64).ok_or(HeapError::Full(len))?;
    Ok(count)
}

fn check_magic(mem: &[u8]) -> Result<(), HeapError> {
    if get(mem, H_MAGIC) != Some(MAGIC) || get(mem, H_END) != Some(mem.len() as u64) {
        return Err(HeapError::BadMagic);
    }
    Ok(())
}

/// The byte range of allocation `index`, validated against the heap.
pub fn region(mem: &[u8], index: usize) -> Result<std::ops::Range<usize>, HeapError> {
    check_magic(mem)?;
    let count = get(mem, H_COUNT).ok_or(HeapError::BadMagic)? as usize;
    if index >= count.min(MAX_ALLOCS) {
        return Err(HeapError::NoSuch(index));
    }
    let data = get(mem, H_TABLE + index * 8).ok_or(HeapError::Damaged(index))? as usize;
    let hdr = data
        .checked_sub(BLOCK_HEADER)
        .filter(|h| *h >= HEADER)
        .ok_or(HeapError::Damaged(index))?;
    if get(mem, hdr) != Some(BLOCK_MAGIC) {
        return Err(HeapError::Damaged(index));
    }
    let len = get(mem, hdr + 8).ok_or(HeapError::Damaged(index))? as usize;
    let end = data.checked_add(len).ok_or(HeapError::Damaged(index))?;
    if end > mem.len() {
        return Err(HeapError::Damaged(index));
    }
    Ok(data..end)
}

/// Bytes a heap needs for allocations of these sizes (header and block headers included).
pub fn heap_size(lens: &[usize]) -> usize {
    lens.iter().fold(HEADER, |at, len| {
        (at + BLOCK_HEADER).next_multiple_of(ALIGN) + len
    })
}

/// Mutable views of allocations `0..n` as `f32` arrays, in allocation order.
///
/// The allocations are disjoint and in increasing address order (a bump heap), so the memory
/// splits into non-overlapping slices.
pub fn f32_views(mem: &mut [u8], n: usize) -> Result<Vec<&mut [f32]>, HeapError> {
    let ranges = (0..n)
        .map(|i| region(mem, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = Vec::with_capacity(n);
    let mut rest = mem;
    let mut consumed = 0;
    for (i, r) in ranges.into_iter().enumerate() {
        if r.start < consumed {
            return Err(HeapError::Damaged(i));
        }
        let (_, tail) = rest.split_at_mut(r.start - consumed);
        let (bytes, tail) = tail.split_at_mut(r.end - r.start);
        consumed = r.end;
        rest = tail;
        out.push(as_f32(bytes).ok_or(HeapError::Misaligned(i))?);
    }
    Ok(out)
}

/// Reinterprets bytes as `f32`s when aligned and a whole number of them.
fn as_f32(bytes: &mut [u8]) -> Option<&mut [f32]> {
    // SAFETY: every bit pattern is a valid f32, and the prefix/suffix check below rejects any
    // misaligned or partial part, so the middle covers exactly the bytes given.
    let (pre, mid, post) = unsafe { bytes.align_to_mut::<f32>() };
    if pre.is_empty() && post.is_empty() {
        Some(mid)
    } else {
        None
    }
}

/// Mutable view of allocation `index` as `u64` words (the scan workloads).
pub fn u64_view(mem: &mut [u8], index: usize) -> Result<&mut [u64], HeapError> {
    let r = region(mem, index)?;
    let bytes = &mut mem[r];
    // SAFETY: every bit pattern is a valid u64; misaligned or partial views are rejected below.
    let (pre, mid, post) = unsafe { bytes.align_to_mut::<u64>() };
    if pre.is_empty() && post.is_empty() {
        Ok(mid)
    } else {
        Err(HeapError::Misaligned(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(len: usize) -> Vec<u64> {
        vec![0u64; len / 8]
    }

    fn bytes(v: &mut [u64]) -> &mut [u8] {
        // SAFETY: test helper: u64 storage viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len() * 8) }
    }

    #[test]
    fn allocations_are_disjoint_aligned_and_found_again() {
        let mut v = mem(64 << 10);
        let m = bytes(&mut v);
        format(m).unwrap();
        let a = p_malloc(m, 1000).unwrap();
        let b = p_malloc(m, 4096).unwrap();
        let ra = region(m, a).unwrap();
        let rb = region(m, b).unwrap();
        assert!(ra.end <= rb.start);
        assert_eq!(ra.len(), 1000);
        assert_eq!(rb.start % ALIGN, 0);
        assert!(rb.end <= heap_size(&[1000, 4096]));
        let views = f32_views(m, 2).unwrap();
        assert_eq!(views[0].len(), 250);
        assert_eq!(views[1].len(), 1024);
    }

    #[test]
    fn damage_is_an_error_not_a_panic() {
        let mut v = mem(16 << 10);
        let m = bytes(&mut v);
        assert_eq!(region(m, 0), Err(HeapError::BadMagic));
        format(m).unwrap();
        assert_eq!(p_malloc(m, 1 << 20), Err(HeapError::Full(1 << 20)));
        let a = p_malloc(m, 64).unwrap();
        assert_eq!(region(m, 1), Err(HeapError::NoSuch(1)));
        // Corrupt the block header and the table entry.
        let r = region(m, a).unwrap();
        m[r.start - 16] ^= 1;
        assert_eq!(region(m, a), Err(HeapError::Damaged(a)));
        put(m, H_TABLE, u64::MAX).unwrap();
        assert_eq!(region(m, a), Err(HeapError::Damaged(a)));
        put(m, H_COUNT, u64::MAX).unwrap();
        assert!(region(m, 5).is_err());
    }
}
