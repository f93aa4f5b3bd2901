//! Pure decision logic for the PMO pager: which pages to pre-populate (decrypt, verify and install)
//! ahead of the guest touching them.
//!
//! This crate does no I/O and starts no threads: the pager feeds it demand faults and feedback and
//! acts on its answers. Keeping it pure means every policy can be unit-tested with recorded or
//! generated traces, and measured at native speed, without a VM.
//!
//! Predictors (see [`PredictorSpec`] for the spec strings):
//! - [`NonePredictor`] (`none`): never predicts; the baseline LPMO `d` design.
//! - [`Stream`] (`stream:N`): the stream buffer of seed 000 §4.2 (LPMO `dN`): next N pages.
//! - [`Stride`] (`stride:N`): per-thread delta detection, for strided walks (TMM's B column).
//! - [`Markov`] (`markov:N`): a bounded correlation table, for repeated irregular fault sequences.
//! - [`Adaptive`] (`adaptive:MAX`): stride with stream fallback whose depth follows measured accuracy.
//!
//! [`Metrics`] tallies accuracy, coverage and timeliness as the paper defines them.
//!
//! Placement between local DRAM and the CXL tier under a DRAM budget (see
//! [`PlacementPolicy`]): [`Fifo`] (`fifo`) and [`Hotness`] (`hotness`).

mod adaptive;
mod markov;
mod metrics;
mod stream;
mod stride;
mod tiering;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub use adaptive::Adaptive;
pub use markov::Markov;
pub use metrics::Metrics;
pub use stream::{NonePredictor, Stream};
pub use stride::Stride;
pub use tiering::{
    placement_from_name, Fifo, Hotness, PageRef, Placement, PlacementPolicy, Tier, TieringError,
};

/// One demand fault seen by the pager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultEvent {
    /// Faulting page, as an index into the PMO (0-based, in pages).
    pub page: u64,
    /// Size of the PMO in pages; predictions must stay below it.
    pub npages: u64,
    /// Faulting thread as the pager knows it (`UFFD_FEATURE_THREAD_ID`), or 0 when unknown.
    /// Per-thread predictors use it so that interleaved walks do not confuse each other.
    pub thread: u32,
}

/// A page-access predictor. The pager owns one per PMO and calls it from its fault threads
/// (under its own lock), hence `Send` but not `Sync`.
pub trait Predictor: Send {
    /// Called for every demand fault; pushes pages worth pre-populating (each < npages, never
    /// the faulting page itself, no duplicates within one call) into `out`, most urgent first.
    fn on_fault(&mut self, ev: &FaultEvent, out: &mut Vec<u64>);
    /// Feedback on an earlier prediction: the page was used (a later access hit it) or wasted.
    fn on_feedback(&mut self, _page: u64, _used: bool) {}
    /// The canonical spec string of this predictor, accepted by [`predictor_from_name`].
    fn name(&self) -> String;
}

/// A bad predictor spec string. Each message names the offending input so a CLI user sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Nothing was given.
    #[error(
        "empty predictor spec (expected one of: none, stream:N, stride:N, markov:N, adaptive:MAX)"
    )]
    Empty,
    /// The name before `:` is not a predictor.
    #[error("unknown predictor {0:?} (expected one of: none, stream:N, stride:N, markov:N, adaptive:MAX)")]
    UnknownPredictor(String),
    /// The depth is not an integer in range.
    #[error("predictor spec {0:?}: bad depth {1:?} (expected an integer from 1 to {MAX_DEPTH})")]
    BadDepth(String, String),
    /// `none` was given an argument.
    #[error("predictor spec {0:?}: {1:?} takes no argument")]
    UnexpectedArgument(String, String),
}

/// Largest depth a spec may ask for. Deeper than this is never useful (a window holds far fewer
/// in-flight pages) and a typo like `stream:40000` would flood the pre-population workers.
pub const MAX_DEPTH: u64 = 1024;

/// Depth used when a spec names a predictor without `:N`.
pub const DEFAULT_DEPTH: usize = 4;

/// A predictor by kind and depth: what `--pmo-predictor` and the harness's options name,
/// parsed once (`"stream:8".parse()`) so that nothing after the configuration holds a string
/// that could still fail. [`PredictorSpec::build`] makes a fresh predictor of it for each
/// attachment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum PredictorSpec {
    /// [`NonePredictor`] (`none`): demand faults only.
    #[default]
    None,
    /// [`Stream`] (`stream[:N]`).
    Stream(usize),
    /// [`Stride`] (`stride[:N]`).
    Stride(usize),
    /// [`Markov`] (`markov[:N]`).
    Markov(usize),
    /// [`Adaptive`] (`adaptive[:MAX]`).
    Adaptive(usize),
}

impl PredictorSpec {
    /// A new predictor of this kind and depth.
    pub fn build(self) -> Box<dyn Predictor> {
        match self {
            PredictorSpec::None => Box::new(NonePredictor),
            PredictorSpec::Stream(n) => Box::new(Stream::new(n)),
            PredictorSpec::Stride(n) => Box::new(Stride::new(n)),
            PredictorSpec::Markov(n) => Box::new(Markov::new(n)),
            PredictorSpec::Adaptive(n) => Box::new(Adaptive::new(n)),
        }
    }

    /// True for `none`: no prefetching at all.
    pub fn is_none(self) -> bool {
        self == PredictorSpec::None
    }
}

/// Parses a predictor spec: `none`, `stream[:N]`, `stride[:N]`, `markov[:N]`, `adaptive[:MAX]`.
/// N defaults to [`DEFAULT_DEPTH`], MAX to [`Adaptive::DEFAULT_MAX_DEPTH`]; both lie in
/// `1..=MAX_DEPTH`.
impl std::str::FromStr for PredictorSpec {
    type Err = PolicyError;

    fn from_str(spec: &str) -> Result<Self, PolicyError> {
        let trimmed = spec.trim();
        if trimmed.is_empty() {
            return Err(PolicyError::Empty);
        }
        let (kind, arg) = match trimmed.split_once(':') {
            Some((k, a)) => (k, Some(a)),
            None => (trimmed, None),
        };
        let depth = |default: usize| -> Result<usize, PolicyError> {
            match arg {
                None => Ok(default),
                Some(a) => match a.parse::<u64>() {
                    Ok(n) if (1..=MAX_DEPTH).contains(&n) => Ok(n as usize),
                    _ => Err(PolicyError::BadDepth(spec.to_string(), a.to_string())),
                },
            }
        };
        match kind {
            "none" => match arg {
                None => Ok(PredictorSpec::None),
                Some(a) => Err(PolicyError::UnexpectedArgument(
                    spec.to_string(),
                    a.to_string(),
                )),
            },
            "stream" => Ok(PredictorSpec::Stream(depth(DEFAULT_DEPTH)?)),
            "stride" => Ok(PredictorSpec::Stride(depth(DEFAULT_DEPTH)?)),
            "markov" => Ok(PredictorSpec::Markov(depth(DEFAULT_DEPTH)?)),
            "adaptive" => Ok(PredictorSpec::Adaptive(depth(Adaptive::DEFAULT_MAX_DEPTH)?)),
            _ => Err(PolicyError::UnknownPredictor(spec.to_string())),
        }
    }
}

/// The canonical spec, which parses back to the same value (and is the built predictor's
/// [`Predictor::name`]).
impl std::fmt::Display for PredictorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PredictorSpec::None => write!(f, "none"),
            PredictorSpec::Stream(n) => write!(f, "stream:{n}"),
            PredictorSpec::Stride(n) => write!(f, "stride:{n}"),
            PredictorSpec::Markov(n) => write!(f, "markov:{n}"),
            PredictorSpec::Adaptive(n) => write!(f, "adaptive:{n}"),
        }
    }
}

/// A new predictor from a spec string ([`PredictorSpec`]'s grammar).
pub fn predictor_from_name(spec: &str) -> Result<Box<dyn Predictor>, PolicyError> {
    Ok(spec.parse::<PredictorSpec>()?.build())
}

/// Pushes `page` into `out` if it is a legal prediction for `ev`: inside the PMO, not the
/// faulting page, and not already pushed in this call (`out[start..]`). Returns whether it was
/// pushed. Every predictor goes through here so the trait's output contract holds in one place.
pub(crate) fn push_candidate(out: &mut Vec<u64>, start: usize, ev: &FaultEvent, page: u64) -> bool {
    if page >= ev.npages || page == ev.page || out[start..].contains(&page) {
        return false;
    }
    out.push(page);
    true
}

/// Pushes `page + 1 ..= page + depth`, clipped to the PMO. They are distinct and never the
/// faulting page, so there is no duplicate check ([`push_candidate`]'s costs O(n) per page:
/// 20 us for a batch at depth 256).
pub(crate) fn push_next(out: &mut Vec<u64>, ev: &FaultEvent, depth: usize) {
    let end = ev
        .page
        .saturating_add(depth as u64)
        .min(ev.npages.saturating_sub(1));
    out.extend(ev.page.saturating_add(1)..=end);
}

/// `page + k * delta` if it stays inside `0..npages`, else `None` (also on overflow).
pub(crate) fn offset_page(page: u64, delta: i64, k: u64, npages: u64) -> Option<u64> {
    let step = delta.checked_mul(i64::try_from(k).ok()?)?;
    let target = i128::from(page) + i128::from(step);
    if target < 0 || target >= i128::from(npages) {
        None
    } else {
        u64::try_from(target).ok()
    }
}
