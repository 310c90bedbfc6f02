//! The pure bookkeeping of event time and processing time, below `job`:
//! the clock ([`Clock`]), the watermark strategies a source applies, the
//! per-split watermarks and idleness of a source subtask
//! ([`SourceWatermarks`]), and the merging of an operator's input
//! watermarks ([`InputWatermarks`]).
//!
//! This room owns only state machines that the shells of `job` drive and
//! `time`'s operators read. It never sends, never touches operator state
//! and never imports `job` or `time`; the public types are re-exported
//! from [`crate::time`], where users find them.

mod clock;
mod merge;
mod source;
mod strategy;

pub use clock::{Clock, ManualClock, SystemClock};
pub use merge::{Advance, InputWatermarks, WATERMARK_MAX_MS};
pub use strategy::{
    BoundedOutOfOrderness, Monotonous, Punctuated, TimestampFn, WatermarkGenerator,
    WatermarkStrategy,
};

pub(crate) use merge::WatermarkState;
pub(crate) use source::{SourceSignal, SourceWatermarks};
