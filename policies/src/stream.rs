//! The baseline predictors: none, and the paper's stream buffer.

use crate::{push_next, FaultEvent, Predictor};

/// Never predicts. The `d` design (DRAM shadow paging without prediction) and the baseline every
/// other predictor must beat.
#[derive(Debug, Default, Clone)]
pub struct NonePredictor;

impl Predictor for NonePredictor {
    fn on_fault(&mut self, _ev: &FaultEvent, _out: &mut Vec<u64>) {}

    fn name(&self) -> String {
        "none".to_string()
    }
}

/// The stream buffer of seed 000 §4.2: after a fault on page p, predict p+1 ..= p+depth, clipped
/// to the PMO. Stateless, so it costs nothing on the fault path.
///
/// A pre-populated page never faults, so the pager holds back the middle page of each batch as a
/// trigger whose (cheap) fault calls the predictor again before the batch runs out: a sequential
/// scan keeps streaming. (The paper's kernel pager took a cheap fault on every first touch; a
/// userfaultfd pager cannot.) With depth 1 there is no middle, and every other page still faults.
#[derive(Debug, Clone)]
pub struct Stream {
    depth: usize,
}

impl Stream {
    /// A predictor of the next `depth` pages.
    pub fn new(depth: usize) -> Self {
        Stream { depth }
    }

    /// How many pages ahead it predicts.
    pub fn depth(&self) -> usize {
        self.depth
    }
}

impl Predictor for Stream {
    fn on_fault(&mut self, ev: &FaultEvent, out: &mut Vec<u64>) {
        push_next(out, ev, self.depth);
    }

    fn name(&self) -> String {
        format!("stream:{}", self.depth)
    }
}
