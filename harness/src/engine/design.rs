//! The designs of the comparison: each a store design plus, for LPMO's `dN` and `adaptive`, a
//! predictor; the columns of the main matrix and of LPMO's CXL figure; the suite of a cell.

use pmo_crypto::Suite;
use pmo_store::Design;

use super::EngineError;

/// A design of the comparison: a store design plus, for LPMO's `dN` and `adaptive`, a predictor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesignSpec {
    /// Label in tables: `wedi`, `sp-id` (the papers' O), `d`, `d2`, `d4`, `d8`, `adaptive`.
    pub label: &'static str,
    /// The store design of the PMO and its sessions.
    pub design: Design,
    /// Spec for `pmo_policies::predictor_from_name`, none for no prediction.
    pub predictor: Option<&'static str>,
}

/// The designs the issue compares, in table order.
pub fn design_specs() -> Vec<DesignSpec> {
    let d = |label, predictor| DesignSpec {
        label,
        design: Design::D,
        predictor,
    };
    vec![
        DesignSpec {
            label: "wedi",
            design: Design::Wedi,
            predictor: None,
        },
        DesignSpec {
            label: "sp-id",
            design: Design::SpId,
            predictor: None,
        },
        d("d", None),
        d("d2", Some("stream:2")),
        d("d4", Some("stream:4")),
        d("d8", Some("stream:8")),
        d("adaptive", Some("adaptive")),
    ]
}

/// The columns of LPMO's CXL figure (seed 000, Fig. 13): O and D on the store file, then the
/// CXL designs on an expander store, with and without a depth-4 stream predictor (the paper's
/// L4 and F4 are `cl4` and `cf4` here). `on_cxl` says which store a column runs on.
pub fn cxl_design_specs() -> Vec<(DesignSpec, bool)> {
    let spec = |label, design, predictor| DesignSpec {
        label,
        design,
        predictor,
    };
    vec![
        (spec("sp-id", Design::SpId, None), false),
        (spec("d", Design::D, None), false),
        (spec("d4", Design::D, Some("stream:4")), false),
        (spec("c", Design::C, None), true),
        (spec("cl", Design::Cl, None), true),
        (spec("cl4", Design::Cl, Some("stream:4")), true),
        (spec("cf", Design::Cf, None), true),
        (spec("cf4", Design::Cf, Some("stream:4")), true),
    ]
}

/// The suite of a cell's PMOs. With integrity, every file design runs the papers' cipher and
/// a keyed MAC (`xts-blake3`), so cells differ only in their design (the product gives `d` the
/// faster `aes-gcm`, which `sp-id` cannot defer tags with; docs/compare.md), and the CXL
/// designs their range key alone; without, the no-MAC benchmark suite (which the CXL designs
/// have not: their tag is their integrity).
pub(crate) fn cell_suite(spec: &DesignSpec, integrity: bool) -> Result<Suite, EngineError> {
    match (integrity, spec.design.needs_range_encryption()) {
        (true, true) => Ok(spec.design.default_suite()),
        (true, false) => Ok(Suite::XtsBlake3),
        (false, false) => Ok(pmo_bench_suites::NOMAC),
        (false, true) => Err(EngineError::NoIntegrityOff(spec.label)),
    }
}
