//! The watermark of one operator instance: the minimum over its non-idle
//! forward inputs, what it last sent on, and the stored form of both.
//!
//! This is pure bookkeeping (DESIGN.md §7): the shell hands every in-band
//! watermark, idleness mark, record batch and end of input to
//! [`InputWatermarks`], and it answers what, if anything, the operator
//! must now fire and send on. It never sends, reads a clock or touches
//! operator state.

use serde::{Deserialize, Serialize};

/// The watermark of end of input: no record with any event time follows.
pub const WATERMARK_MAX_MS: u64 = u64::MAX;

/// What the operator must do after an input changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// Nothing changed downstream.
    None,
    /// The operator's watermark rose to this value: fire what is due at
    /// or below it, then send it on every output.
    To(u64),
    /// Every open forward input is idle: send an idleness mark on.
    Idle,
}

/// One input channel's watermark as recorded in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct InputMark {
    /// The highest watermark seen on the channel, if any.
    watermark_ms: Option<u64>,
    /// Whether the channel's last signal was an idleness mark.
    idle: bool,
}

/// The stored form of an operator's watermarks: per input, then what it
/// sent on. A restore resumes from exactly this, never from the minimum
/// (FLINK-36663: restarting from the minimum fired windows twice).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub(crate) struct WatermarkState {
    inputs: Vec<InputMark>,
    output_ms: Option<u64>,
    output_idle: bool,
}

impl WatermarkState {
    /// The stored bytes. This and [`WatermarkState::decode`] are the only
    /// places that know this layout; the shells call them through
    /// `PartBytes`.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_allocvec(self)
    }

    /// Reads bytes written by [`WatermarkState::encode`].
    pub(crate) fn decode(bytes: &[u8]) -> Result<WatermarkState, postcard::Error> {
        postcard::from_bytes(bytes)
    }

    /// The state of a subtask without inputs (a source) that has sent
    /// `output_ms` on.
    pub(crate) fn sent(output_ms: Option<u64>) -> WatermarkState {
        WatermarkState {
            inputs: Vec::new(),
            output_ms,
            output_idle: false,
        }
    }

    /// The watermark this operator had sent on.
    pub(crate) fn output_ms(&self) -> Option<u64> {
        self.output_ms
    }
}

/// The per-input watermarks of one operator instance and the minimum it
/// has sent on.
///
/// Back edges of cycles never count (a minimum over a feedback edge never
/// advances); an idle input drops out of the minimum until it carries a
/// batch or a watermark again; an ended input counts as
/// [`WATERMARK_MAX_MS`].
#[derive(Debug, Clone)]
pub struct InputWatermarks {
    inputs: Vec<InputMark>,
    back_edge: Vec<bool>,
    ended: Vec<bool>,
    output_ms: Option<u64>,
    output_idle: bool,
    regressions: u64,
    /// Whether a watermark or idleness mark ever arrived (or was
    /// restored): without one the job has no event time here, and its
    /// parts keep their old bytes.
    seen: bool,
}

impl InputWatermarks {
    /// Bookkeeping for inputs whose back-edge flags are `back_edge`
    /// (input index = position).
    pub fn new(back_edge: Vec<bool>) -> Self {
        let count = back_edge.len();
        InputWatermarks {
            inputs: vec![InputMark::default(); count],
            back_edge,
            ended: vec![false; count],
            output_ms: None,
            output_idle: false,
            regressions: 0,
            seen: false,
        }
    }

    /// The watermark this operator has sent on, if any.
    pub fn output_ms(&self) -> Option<u64> {
        self.output_ms
    }

    /// Whether this operator last sent an idleness mark (every open
    /// forward input idle) rather than a watermark.
    pub(crate) fn output_is_idle(&self) -> bool {
        self.output_idle
    }

    /// How many watermarks arrived lower than their channel's previous one
    /// (ignored, as DESIGN.md §7 says).
    pub fn regressions(&self) -> u64 {
        self.regressions
    }

    /// Whether no watermark or idleness mark ever arrived, so a snapshot
    /// has nothing of event time to keep (end of input alone is not
    /// event time: every job has it).
    pub(crate) fn is_pristine(&self) -> bool {
        !self.seen
    }

    /// A watermark arrived on `input`.
    pub fn on_watermark(&mut self, input: usize, watermark_ms: u64) -> Advance {
        let Some(mark) = self.inputs.get_mut(input) else {
            return Advance::None;
        };
        self.seen = true;
        mark.idle = false;
        match mark.watermark_ms {
            Some(previous) if watermark_ms < previous => self.regressions += 1,
            _ => mark.watermark_ms = Some(watermark_ms),
        }
        self.advance()
    }

    /// An idleness mark arrived on `input`.
    pub fn on_idle(&mut self, input: usize) -> Advance {
        if let Some(mark) = self.inputs.get_mut(input) {
            mark.idle = true;
            self.seen = true;
        }
        self.advance()
    }

    /// A record batch arrived on `input`: an idle input is active again.
    /// It can only lower the minimum, and what was sent on never goes
    /// back, so nothing is due.
    #[inline]
    pub fn on_batch(&mut self, input: usize) {
        if let Some(mark) = self.inputs.get_mut(input) {
            mark.idle = false;
        }
        self.output_idle = false;
    }

    /// `input` ended: it counts as watermark +infinity from now on.
    pub fn on_end(&mut self, input: usize) -> Advance {
        if let Some(ended) = self.ended.get_mut(input) {
            *ended = true;
        }
        self.advance()
    }

    /// The minimum over the open, non-idle forward inputs; `Some(MAX)`
    /// when every forward input ended, `None` while one has no watermark
    /// yet or there is no forward input at all, and `Err(())` when every
    /// open forward input is idle.
    fn combined(&self) -> Result<Option<u64>, ()> {
        if self.back_edge.iter().all(|&back_edge| back_edge) {
            return Ok(None);
        }
        let mut minimum = Some(WATERMARK_MAX_MS);
        let mut any_open = false;
        let mut any_active = false;
        for (index, mark) in self.inputs.iter().enumerate() {
            if self.back_edge[index] || self.ended[index] {
                continue;
            }
            any_open = true;
            if mark.idle {
                continue;
            }
            any_active = true;
            minimum = match (minimum, mark.watermark_ms) {
                (Some(low), Some(watermark)) => Some(low.min(watermark)),
                _ => None,
            };
        }
        if any_open && !any_active {
            return Err(());
        }
        Ok(minimum)
    }

    fn advance(&mut self) -> Advance {
        match self.combined() {
            Err(()) if !self.output_idle => {
                self.output_idle = true;
                Advance::Idle
            }
            Err(()) => Advance::None,
            Ok(Some(watermark)) if rises(self.output_ms, watermark) => {
                self.output_ms = Some(watermark);
                self.output_idle = false;
                Advance::To(watermark)
            }
            Ok(_) => Advance::None,
        }
    }

    /// What a snapshot keeps.
    pub(crate) fn state(&self) -> WatermarkState {
        WatermarkState {
            inputs: self.inputs.clone(),
            output_ms: self.output_ms,
            output_idle: self.output_idle,
        }
    }

    /// Resumes from a snapshot's watermarks. A snapshot taken with another
    /// number of inputs (a rescaled job) keeps only what was sent on, so
    /// the output never goes back; the inputs start afresh.
    pub(crate) fn restore(&mut self, state: WatermarkState) {
        self.seen = true;
        if state.inputs.len() == self.inputs.len() {
            self.inputs = state.inputs;
            self.output_idle = state.output_idle;
        }
        self.output_ms = state.output_ms;
    }
}

/// Whether `watermark_ms` is above what was sent on (anything is, before
/// the first).
fn rises(sent_ms: Option<u64>, watermark_ms: u64) -> bool {
    match sent_ms {
        Some(sent_ms) => watermark_ms > sent_ms,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` (`w<input>=<ms>`, `i<input>` idle, `b<input>` batch,
    /// `e<input>` end) on inputs with back-edge flags `back_edge` and
    /// checks the last answer.
    fn check(back_edge: &[bool], steps: &[&str], want: Advance) {
        let mut marks = InputWatermarks::new(back_edge.to_vec());
        let mut last = Advance::None;
        for step in steps {
            let (kind, rest) = step.split_at(1);
            let (input, value) = rest.split_once('=').unwrap_or((rest, "0"));
            let input: usize = input.parse().expect("bug in the test: input");
            let value: u64 = value.parse().expect("bug in the test: value");
            last = match kind {
                "w" => marks.on_watermark(input, value),
                "i" => marks.on_idle(input),
                "e" => marks.on_end(input),
                "b" => {
                    marks.on_batch(input);
                    Advance::None
                }
                other => panic!("bug in the test: step {other}"),
            };
        }
        assert_eq!(last, want, "steps {steps:?} on {back_edge:?}");
    }

    #[test]
    fn minimum_over_inputs() {
        check(&[false], &["w0=5"], Advance::To(5));
        check(&[false, false], &["w0=5"], Advance::None);
        check(&[false, false], &["w0=5", "w1=3"], Advance::To(3));
        check(&[false, false], &["w0=5", "w1=3", "w1=9"], Advance::To(5));
        check(&[false, false], &["w0=5", "w1=3", "w1=4"], Advance::To(4));
    }

    #[test]
    fn lower_or_equal_watermarks_change_nothing() {
        check(&[false], &["w0=5", "w0=4"], Advance::None);
        check(&[false], &["w0=5", "w0=5"], Advance::None);
        let mut marks = InputWatermarks::new(vec![false]);
        marks.on_watermark(0, 5);
        marks.on_watermark(0, 4);
        assert_eq!(marks.regressions(), 1);
        assert_eq!(marks.output_ms(), Some(5));
    }

    #[test]
    fn back_edges_never_hold_the_watermark() {
        check(&[false, true], &["w0=5"], Advance::To(5));
        check(&[true], &["w0=5"], Advance::None);
    }

    #[test]
    fn idle_inputs_drop_out_until_they_carry_data() {
        check(&[false, false], &["w0=5", "i1"], Advance::To(5));
        check(
            &[false, false],
            &["i1", "w0=5", "b1", "w0=7"],
            Advance::None,
        );
        check(
            &[false, false],
            &["i1", "w0=5", "w1=6", "w0=7"],
            Advance::To(6),
        );
        check(&[false, false], &["i0", "i1"], Advance::Idle);
        check(&[false, false], &["i0", "i1", "i0"], Advance::None);
    }

    #[test]
    fn end_of_input_alone_is_not_event_time() {
        let mut marks = InputWatermarks::new(vec![false]);
        assert_eq!(marks.on_end(0), Advance::To(WATERMARK_MAX_MS));
        assert!(
            marks.is_pristine(),
            "a part without event time keeps its bytes"
        );
        let mut marks = InputWatermarks::new(vec![false]);
        let _ = marks.on_idle(0);
        assert!(!marks.is_pristine());
    }

    #[test]
    fn end_of_input_is_plus_infinity() {
        check(&[false, false], &["w0=5", "e1"], Advance::To(5));
        check(
            &[false, false],
            &["e0", "e1"],
            Advance::To(WATERMARK_MAX_MS),
        );
        check(&[false, true], &["e0"], Advance::To(WATERMARK_MAX_MS));
    }

    #[test]
    fn the_output_never_goes_back() {
        // Input 1 wakes up behind input 0: the minimum drops, but what was
        // sent on stays.
        check(
            &[false, false],
            &["w0=9", "i1", "w1=2", "w0=10"],
            Advance::None,
        );
        check(
            &[false, false],
            &["w0=9", "i1", "w1=2", "w1=12", "w0=10"],
            Advance::To(10),
        );
    }

    #[test]
    fn restore_resumes_from_the_snapshot_not_the_minimum() {
        let mut before = InputWatermarks::new(vec![false, false]);
        before.on_watermark(0, 9);
        before.on_idle(1);
        let state =
            WatermarkState::decode(&before.state().encode().expect("encodes")).expect("decodes");
        let mut after = InputWatermarks::new(vec![false, false]);
        after.restore(state.clone());
        assert_eq!(after.output_ms(), Some(9));
        // Input 1 is still idle: input 0 alone moves the watermark.
        assert_eq!(after.on_watermark(0, 11), Advance::To(11));
        // Another number of inputs keeps only what was sent on.
        let mut rescaled = InputWatermarks::new(vec![false]);
        rescaled.restore(state);
        assert_eq!(rescaled.output_ms(), Some(9));
        assert_eq!(rescaled.on_watermark(0, 3), Advance::None);
    }
}
