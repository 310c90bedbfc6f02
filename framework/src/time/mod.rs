//! Event time: timestamps, watermarks and processing-time clocks.
//!
//! This module owns the rules of DESIGN.md §7 as pure bookkeeping:
//! [`WatermarkStrategy`] (how a source subtask turns event times into
//! watermarks and idleness), [`InputWatermarks`] (an operator's watermark
//! as the minimum over its non-idle forward inputs, and its stored form),
//! [`Timers`] (event-time timers of keyed process functions, stored as
//! keyed state by key group so they rescale, fired in timestamp order
//! when the watermark passes them), and [`Clock`] (processing time, one
//! trait, so tests drive it), and [`Windows`] (tumbling and sliding
//! event-time windows with an incremental aggregate and allowed lateness,
//! built on the timers).
//!
//! It never sends, spawns or blocks, never touches a channel or an
//! operator's state, and never decides a protocol question: the shells in
//! `job` carry watermarks in-band as control items on the same FIFO
//! channels as records and barriers, ask this module what is due, and
//! store what it hands them in the operator's part of a checkpoint.

mod clock;
mod source;
mod strategy;
mod timers;
mod watermark;
mod window;

pub use clock::{Clock, ManualClock, SystemClock};
pub use strategy::{
    BoundedOutOfOrderness, Punctuated, TimestampFn, WatermarkGenerator, WatermarkStrategy,
};
pub use timers::Timers;
pub use watermark::{Advance, InputWatermarks, WATERMARK_MAX_MS};
pub use window::{LateRecords, WindowError, Windowed, WindowedStream, Windows};

pub(crate) use source::{SourceSignal, SourceWatermarks};
pub(crate) use timers::{rescale_timed_states, TimedFn, TimedKeyedCore};
pub(crate) use watermark::WatermarkState;
