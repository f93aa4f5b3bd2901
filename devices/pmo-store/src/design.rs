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
//! | `cl` (LPMO CL) | key check | verify into the window (the expander's range key decrypted it) | as `d` | as `d` |
//! | `c` (LPMO C) | key check + verify every page | verify into the window | as `d` | as `d` |
//! | `cf` (LPMO CF) | as `cl` | as `cl`, the window page standing for expander device memory | as `d` | as `d` |
//!
//! The `id` variants defer the per-page tag (the paper's checksum) from psync to detach (UC):
//! psync encrypts and commits pages with a zero tag (their version is still covered by the tree),
//! the session keeps their plaintext as the shadow, and detach (or the crash handler when the
//! session is dropped) computes the tags and commits them. After a power loss the next attach
//! (which has the key) runs the crash handler: tags are computed from the ciphertext on the medium,
//! which trusts the medium for those pages in that window, as the paper does. With the `aes-gcm`
//! suite the tag cannot be separated from encryption, so `id` behaves as `ip`. See docs/store.md.
//!
//! `c`, `cl` and `cf` are LPMO's CXL designs (seed 000 section 5.1): the PMO's extent lies in a TEE
//! range of the CXL expander, whose range key is the only encryption (suite `tee-blake3`, their
//! default) and the CPU checks each page's keyed tag. They are refused on a medium that does not
//! encrypt the extent. `c` checks the whole PMO at attach (LPMO 5.2.2), so a tampered page
//! refuses the attach instead of surfacing at some later access. On a store with a working area
//! the PMO service maps a `c` attachment's working copy, on the expander, straight into the
//! guest; elsewhere its faults check each page again, so media changed during the attachment is
//! refused where it is read (docs/cxl-media.md).
//! `cf` differs from `cl` only in where its working copy is: in the expander's device memory,
//! so the pager charges each page moved into or out of it and keeps it out of the local DRAM
//! budget ([`Design::working_copy_on_device`]); the store does the same for both.

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
    /// LPMO CL: as `d`, the PMO on range-encrypted CXL media.
    Cl,
    /// LPMO C: as `cl`, and the whole PMO checked at attach.
    C,
    /// LPMO CF: as `cl`, the working copy in the expander's device memory.
    Cf,
}

impl Design {
    /// Every design, for tests and benches.
    pub const ALL: [Design; 9] = [
        Design::Wedi,
        Design::BpIp,
        Design::BpId,
        Design::SpIp,
        Design::SpId,
        Design::D,
        Design::Cl,
        Design::C,
        Design::Cf,
    ];

    /// The designs that run on any medium (every one but the CXL designs, which need an
    /// extent the medium encrypts: [`Design::needs_range_encryption`]).
    pub const ON_ANY_MEDIUM: [Design; 6] = [
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
            Design::Cl => 7,
            Design::C => 8,
            Design::Cf => 9,
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
            Design::Cl => "cl",
            Design::C => "c",
            Design::Cf => "cf",
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
    /// The PMO must lie on an extent the medium encrypts itself (the CXL designs).
    pub fn needs_range_encryption(self) -> bool {
        matches!(self, Design::C | Design::Cl | Design::Cf)
    }
    /// The working copy lives in the CXL expander's device memory rather than in local DRAM
    /// (LPMO CF): transfers into and out of it are charged, the DRAM budget does not count it.
    pub fn working_copy_on_device(self) -> bool {
        self == Design::Cf
    }
    /// The suite of PMOs created with this design: the fastest one that gives the design its
    /// whole behaviour. The CXL designs leave encryption to the expander's range key; the `id`
    /// designs need a tag computed apart from the encryption (they defer it), which only
    /// `xts-blake3` has; every other design gets `aes-gcm`, whose tag comes out of the same
    /// pass as the cipher (docs/store.md, "Choice").
    pub fn default_suite(self) -> pmo_crypto::Suite {
        use pmo_crypto::Suite;
        if self.needs_range_encryption() {
            Suite::TeeBlake3
        } else if self.defers_checksum() {
            Suite::XtsBlake3
        } else {
            Suite::AesGcm
        }
    }
    /// Every page is verified when a session starts (LPMO C's integrity check at attach).
    pub fn verifies_at_attach(self) -> bool {
        self == Design::C
    }
    /// Touched pages are re-encrypted at detach (BP's EPP/CPP).
    pub fn reencrypt_touched_at_detach(self) -> bool {
        matches!(self, Design::BpIp | Design::BpId)
    }
}

/// A design name that is none of [`Design::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown PMO design {0:?} (expected one of: wedi, bp-ip, bp-id, sp-ip, sp-id, d, cl, c, cf)"
)]
pub struct UnknownDesign(pub String);

impl std::str::FromStr for Design {
    type Err = UnknownDesign;

    fn from_str(s: &str) -> Result<Self, UnknownDesign> {
        Design::from_name(s).ok_or_else(|| UnknownDesign(s.to_string()))
    }
}

impl std::fmt::Display for Design {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pmo_crypto::Suite;

    /// Each design's PMOs get the suite that gives the design its whole behaviour: the
    /// deferred tags of the `id` designs need a tag computed apart from the encryption, the CXL
    /// designs have no software cipher, and the rest take the one-pass AEAD.
    #[test]
    fn every_design_gets_a_suite_it_can_run_whole() {
        let table = [
            (Design::Wedi, Suite::AesGcm),
            (Design::BpIp, Suite::AesGcm),
            (Design::BpId, Suite::XtsBlake3),
            (Design::SpIp, Suite::AesGcm),
            (Design::SpId, Suite::XtsBlake3),
            (Design::D, Suite::AesGcm),
            (Design::Cl, Suite::TeeBlake3),
            (Design::C, Suite::TeeBlake3),
            (Design::Cf, Suite::TeeBlake3),
        ];
        assert_eq!(table.len(), Design::ALL.len());
        for (d, s) in table {
            assert_eq!(d.default_suite(), s, "{}", d.name());
        }
        assert_eq!(crate::CreateOptions::default().suite(), Suite::AesGcm);
        let sp_id = crate::CreateOptions {
            design: Design::SpId,
            ..Default::default()
        };
        assert_eq!(sp_id.suite(), Suite::XtsBlake3);
    }

    #[test]
    fn every_design_parses_from_its_name_and_an_unknown_one_names_the_accepted() {
        for d in Design::ALL {
            assert_eq!(d.to_string().parse::<Design>(), Ok(d));
        }
        let e = "D".parse::<Design>().unwrap_err().to_string();
        assert!(
            e.contains("\"D\"") && e.contains("sp-id") && e.contains("cf"),
            "{e}"
        );
        // The message lists every design there is.
        for d in Design::ALL {
            assert!(e.contains(d.name()), "{e} lacks {}", d.name());
        }
    }
}
