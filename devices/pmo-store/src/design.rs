//! The designs of the papers, as selectable behaviours of one engine.
//!
//! In pmovmm the plaintext working copy of a page lives in the guest-visible window owned by the
//! pager (the LPMO "DRAM shadow"); the medium only ever holds ciphertext, so invariant 1 holds even
//! after a power loss without a UPS-backed crash handler. What the designs change is *when* the
//! crypto work happens, which is what the papers compare:
//!
//! | design | attach | fault | psync | detach |
//! |---|---|---|---|---|
//! | `wedi` (WED/Ip) | decrypt + verify every page | copy from the attach-time plaintext | encrypt dirty pages via journal area, then re-verify every page (whole-PMO checksum) | re-encrypt every page under a new version |
//! | `bp-ip`, `bp-id` | key check | decrypt + verify one page (DP, CPF) | encrypt dirty pages into journal area (P), commit, copy (CP) | re-encrypt every touched page (EPP, CPP), scrub journal area (DS) |
//! | `sp-ip`, `sp-id` | key check | decrypt + verify one page (DP) | encrypt dirty pages into journal area (P/EPP), commit, copy | scrub journal area (DS) |
//! | `d` (LPMO) | key check | decrypt + verify into the window (Dc) | encrypt dirty pages into journal area (EP), commit, copy (TC) | scrub journal area (DT) |
//!
//! The `id` variants defer the per-page tag (the paper's checksum) from psync to detach (UC):
//! psync encrypts and commits pages with a zero tag (their version is still covered by the tree),
//! the session keeps their plaintext as the shadow, and detach (or the crash handler when the
//! session is dropped) computes the tags and commits them. After a power loss the next attach
//! (which has the key) runs the crash handler: tags are computed from the ciphertext on the medium,
//! which trusts the medium for those pages in that window, as the paper does. With the `aes-gcm`
//! suite the tag cannot be separated from encryption, so `id` behaves as `ip`. See docs/store.md.

/// A PMO design (names from the seeds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Design {
    /// Whole-PMO encryption, decryption and integrity verification (WED/Ip).
    Wedi,
    /// LOaPP: both pages, checksum at psync.
    BpIp,
    /// LOaPP: both pages, checksum at detach.
    BpId,
    /// LOaPP: shadow page, checksum at psync.
    SpIp,
    /// LOaPP: shadow page, checksum at detach.
    SpId,
    /// LPMO: DRAM shadow + temporary shadow copy.
    D,
}

impl Design {
    /// Every design, for tests and benches.
    pub const ALL: [Design; 6] = [
        Design::Wedi,
        Design::BpIp,
        Design::BpId,
        Design::SpIp,
        Design::SpId,
        Design::D,
    ];

    /// On-media code.
    pub fn code(self) -> u8 {
        match self {
            Design::Wedi => 1,
            Design::BpIp => 2,
            Design::BpId => 3,
            Design::SpIp => 4,
            Design::SpId => 5,
            Design::D => 6,
        }
    }
    /// Parses the on-media code.
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.code() == c)
    }
    /// Name as in the architecture doc.
    pub fn name(self) -> &'static str {
        match self {
            Design::Wedi => "wedi",
            Design::BpIp => "bp-ip",
            Design::BpId => "bp-id",
            Design::SpIp => "sp-ip",
            Design::SpId => "sp-id",
            Design::D => "d",
        }
    }
    /// Parses a name.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == s)
    }
    /// Whole-PMO work at attach / psync / detach.
    pub fn whole(self) -> bool {
        self == Design::Wedi
    }
    /// Checksums (tags) are updated at detach instead of psync (LOaPP Id).
    pub fn defers_checksum(self) -> bool {
        matches!(self, Design::BpId | Design::SpId)
    }
    /// Touched pages are re-encrypted at detach (BP's EPP/CPP).
    pub fn reencrypt_touched_at_detach(self) -> bool {
        matches!(self, Design::BpIp | Design::BpId)
    }
}
