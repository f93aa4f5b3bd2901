//! The PCIe configuration-space structures of the memory device: the two
//! CXL DVSECs Linux's `cxl_pci` needs and the device serial number.
//!
//! The VMM owns the configuration space (its `PciConfig`); this module only
//! produces the bytes and write masks of each extended capability body (the
//! part after the 4-byte extended capability header), so the layouts are
//! tested here, next to the rest of the device model.

/// Extended capability id of a Designated Vendor-Specific Extended Capability.
pub const DVSEC_CAP_ID: u16 = 0x23;
/// Extended capability id of the Device Serial Number capability.
pub const DSN_CAP_ID: u16 = 0x03;
/// Vendor id the CXL consortium assigned for its DVSECs.
pub const CXL_VENDOR_ID: u16 = 0x1e98;
/// DVSEC id 0: "PCIe DVSEC for CXL devices".
pub const DVSEC_ID_DEVICE: u16 = 0;
/// DVSEC id 8: "Register Locator".
pub const DVSEC_ID_REGISTER_LOCATOR: u16 = 8;

// Byte offsets inside the CXL device DVSEC (CXL 2.0 8.1.3, "PCIe DVSEC for
// CXL Device"), counted from the capability start (as the CXL specification
// and Linux count them).

/// DVSEC CXL Capability (16 bits): what the device can do (cache, I/O,
/// memory) and how many HDM ranges it reports.
pub const DEV_CAP: usize = 0x0a;
/// DVSEC CXL Control (16 bits): the protocol enables the guest sets.
pub const DEV_CTRL: usize = 0x0c;
/// DVSEC CXL Range 1 Size High: bits 63:32 of the range-1 capacity.
pub const DEV_RANGE1_SIZE_HIGH: usize = 0x18;
/// DVSEC CXL Range 1 Size Low: bits 31:28 of the capacity (256 MiB units)
/// plus the memory status and media description bits below them.
pub const DEV_RANGE1_SIZE_LOW: usize = 0x1c;
/// DVSEC CXL Range 1 Base High: bits 63:32 of the range-1 base address.
pub const DEV_RANGE1_BASE_HIGH: usize = 0x20;
/// DVSEC CXL Range 1 Base Low: bits 31:28 of the range-1 base address.
pub const DEV_RANGE1_BASE_LOW: usize = 0x24;
/// Length of the CXL device DVSEC (CXL 2.0).
pub const DEV_LEN: usize = 0x3c;

/// DVSEC CXL Capability bit 2, Mem_Capable: the device speaks CXL.mem.
pub const DEV_CAP_MEM_CAPABLE: u16 = 1 << 2;
/// DVSEC CXL Capability bits 5:4, HDM_Count, set to 1: the device reports
/// one memory range (range 1).
pub const DEV_CAP_HDM_COUNT_1: u16 = 1 << 4;
/// Control bit the guest sets to let the device decode memory; clear at reset.
pub const DEV_CTRL_MEM_ENABLE: u16 = 1 << 2;
// Range size-low bits the driver waits for before it trusts the device.

/// Range Size Low bit 0, Memory_Info_Valid: the size and media fields of
/// the range can be read.
pub const RANGE_MEM_INFO_VALID: u32 = 1 << 0;
/// Range Size Low bit 1, Memory_Active: the memory of the range is ready
/// for use.
pub const RANGE_MEM_ACTIVE: u32 = 1 << 1;
/// Media type "not memory-class volatile" / memory class "CXL": both 0b010.
const RANGE_MEDIA_TYPE_CXL: u32 = 0b010 << 2;
const RANGE_MEMORY_CLASS_CXL: u32 = 0b010 << 5;

// Register Block Identifiers of the Register Locator DVSEC (CXL 2.0 8.1.9).

/// Register Block Identifier 1: the component registers (where the HDM
/// decoder capability lives).
pub const BLOCK_COMPONENT: u8 = 1;
/// Register Block Identifier 3: the CXL memory device registers
/// (capability array, device status, mailbox, memory device status).
pub const BLOCK_MEMDEV: u8 = 3;

/// One capability body (after its extended header) and its write mask.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapBody {
    /// The capability's initial contents, little-endian, starting right
    /// after the 4-byte extended capability header.
    pub body: Vec<u8>,
    /// Same length as `body`: a 1 bit marks a bit the guest may write; all
    /// other bits are read-only.
    pub wmask: Vec<u8>,
}

fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// DVSEC header 1 and 2 (at body offsets 0 and 4): vendor, revision, length, id.
fn dvsec_header(b: &mut [u8], revision: u8, len: usize, id: u16) {
    let h1 = u32::from(CXL_VENDOR_ID) | (u32::from(revision & 0xf) << 16) | ((len as u32) << 20);
    put32(b, 0, h1);
    put16(b, 4, id);
}

/// The CXL device DVSEC of a memory expander with `size` bytes of
/// capacity in range 1 (reported valid and active: the media is ready at
/// once, there is nothing to train).
pub fn device_dvsec(size: u64) -> CapBody {
    // Body offsets are DVSEC offsets minus the 4-byte extended header.
    let at = |dvsec_off: usize| dvsec_off - 4;
    let mut body = vec![0u8; DEV_LEN - 4];
    let mut wmask = vec![0u8; DEV_LEN - 4];
    dvsec_header(&mut body, 1, DEV_LEN, DVSEC_ID_DEVICE);
    put16(
        &mut body,
        at(DEV_CAP),
        DEV_CAP_MEM_CAPABLE | DEV_CAP_HDM_COUNT_1,
    );
    put16(&mut wmask, at(DEV_CTRL), DEV_CTRL_MEM_ENABLE);
    put32(&mut body, at(DEV_RANGE1_SIZE_HIGH), (size >> 32) as u32);
    let low = (size as u32 & 0xf000_0000)
        | RANGE_MEM_INFO_VALID
        | RANGE_MEM_ACTIVE
        | RANGE_MEDIA_TYPE_CXL
        | RANGE_MEMORY_CLASS_CXL;
    put32(&mut body, at(DEV_RANGE1_SIZE_LOW), low);
    // Range base: the guest may program it (256 MiB granularity); we only
    // decode through the HDM decoder, so it is storage.
    put32(&mut wmask, at(DEV_RANGE1_BASE_HIGH), 0xffff_ffff);
    put32(&mut wmask, at(DEV_RANGE1_BASE_LOW), 0xf000_0000);
    CapBody { body, wmask }
}

/// One register block the locator points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegBlock {
    /// Register BIR: which BAR holds the block (only bits 2:0 are encoded).
    pub bar: u8,
    /// Register Block Identifier, e.g. [`BLOCK_COMPONENT`] or
    /// [`BLOCK_MEMDEV`].
    pub block_id: u8,
    /// Offset inside the BAR; 64 KiB aligned.
    pub offset: u64,
}

/// The Register Locator DVSEC listing `blocks`.
pub fn register_locator(blocks: &[RegBlock]) -> CapBody {
    let len = 0x0c + 8 * blocks.len();
    let mut body = vec![0u8; len - 4];
    dvsec_header(&mut body, 0, len, DVSEC_ID_REGISTER_LOCATOR);
    for (i, b) in blocks.iter().enumerate() {
        let off = 0x0c - 4 + 8 * i;
        let low =
            u32::from(b.bar & 0x7) | (u32::from(b.block_id) << 8) | (b.offset as u32 & 0xffff_0000);
        put32(&mut body, off, low);
        put32(&mut body, off + 4, (b.offset >> 32) as u32);
    }
    let wmask = vec![0u8; body.len()];
    CapBody { body, wmask }
}

/// The Device Serial Number capability: `cxl list` shows this as the
/// memdev's serial.
pub fn serial_number(serial: u64) -> CapBody {
    CapBody {
        body: serial.to_le_bytes().to_vec(),
        wmask: vec![0; 8],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u32_at(b: &[u8], dvsec_off: usize) -> u32 {
        let o = dvsec_off - 4;
        u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
    }

    #[test]
    fn device_dvsec_reports_memory_and_size() {
        let d = device_dvsec(3 << 28);
        assert_eq!(d.body.len(), DEV_LEN - 4);
        let h1 = u32_at(&d.body, 4);
        assert_eq!(h1 & 0xffff, u32::from(CXL_VENDOR_ID));
        assert_eq!(h1 >> 20, DEV_LEN as u32);
        assert_eq!(u32_at(&d.body, 8) & 0xffff, u32::from(DVSEC_ID_DEVICE));
        let cap = u32_at(&d.body, 8) >> 16;
        assert_ne!(cap & u32::from(DEV_CAP_MEM_CAPABLE), 0);
        assert_eq!((cap >> 4) & 3, 1, "one HDM range");
        let low = u32_at(&d.body, DEV_RANGE1_SIZE_LOW);
        assert_eq!(low & 0xf000_0000, 0x3000_0000);
        assert_eq!(low & 3, 3, "info valid and active");
        assert_eq!(u32_at(&d.body, DEV_RANGE1_SIZE_HIGH), 0);
        // Only Mem_Enable of the control word is writable; it starts clear.
        assert_eq!(
            u32_at(&d.wmask, DEV_CTRL) & 0xffff,
            u32::from(DEV_CTRL_MEM_ENABLE)
        );
        assert_eq!(u32_at(&d.body, DEV_CTRL) & 0xffff, 0);
        let big = device_dvsec(5 << 32);
        assert_eq!(u32_at(&big.body, DEV_RANGE1_SIZE_HIGH), 5);
    }

    #[test]
    fn locator_lists_blocks() {
        let l = register_locator(&[
            RegBlock {
                bar: 0,
                block_id: BLOCK_COMPONENT,
                offset: 0,
            },
            RegBlock {
                bar: 0,
                block_id: BLOCK_MEMDEV,
                offset: 0x1_0000,
            },
        ]);
        assert_eq!(l.body.len(), 0x0c + 16 - 4);
        assert_eq!(u32_at(&l.body, 4) >> 20, 0x1c);
        assert_eq!(u32_at(&l.body, 8) & 0xffff, 8);
        assert_eq!(u32_at(&l.body, 0x0c), 0x100);
        assert_eq!(u32_at(&l.body, 0x14), 0x1_0300);
        assert!(l.wmask.iter().all(|m| *m == 0));
    }

    #[test]
    fn serial_is_little_endian() {
        let s = serial_number(0x1122_3344_5566_7788);
        assert_eq!(s.body, 0x1122_3344_5566_7788u64.to_le_bytes());
    }
}
