//! Event time: timestamps, watermarks and processing-time clocks.
//!
//! This module owns the rules of DESIGN.md §7 as pure bookkeeping:
//! [`WatermarkStrategy`] (how a source subtask turns event times into
//! watermarks and idleness), [`InputWatermarks`] (an operator's watermark
//! as the minimum over its non-idle forward inputs, and its stored form),
//! [`Timers`] (event-time and processing-time timers of keyed process
//! functions, stored as keyed state by key group so they rescale, fired
//! in timestamp order when the watermark or the clock passes them),
//! [`Clock`] (processing time, one trait, so tests drive it), [`Windows`]
//! (tumbling, sliding and session windows on event or processing time
//! with an incremental aggregate, a reduce or a full-window function,
//! allowed lateness and late records dropped or sent to a stream of
//! their own, built on the timers) and [`StateTtl`] (per-key
//! time-to-live of keyed state, also built on the timers).
//!
//! It never sends, spawns or blocks, never touches a channel or an
//! operator's state, and never decides a protocol question: the shells in
//! `job` carry watermarks in-band as control items on the same FIFO
//! channels as records and barriers, ask this module what is due, and
//! store what it hands them in the operator's part of a checkpoint.

mod clock;
mod source;
mod strategy;
mod timed_state;
mod timed_table;
#[cfg(test)]
mod timed_tests;
mod timers;
mod ttl;
mod watermark;
mod window;
mod window_fn;
mod window_state;
mod windowed;

pub use clock::{Clock, ManualClock, SystemClock};
pub use strategy::{
    BoundedOutOfOrderness, Monotonous, Punctuated, TimestampFn, WatermarkGenerator,
    WatermarkStrategy,
};
pub use timers::{TimeDomain, Timers};
pub use ttl::{StateTtl, TtlError};
pub use watermark::{Advance, InputWatermarks, WATERMARK_MAX_MS};
pub use window::{LateRecords, WindowError, Windowed, Windows};
pub use windowed::{
    DropLate, LatePolicy, NoEventTime, SideOutputLate, WindowOutput, WindowedStream,
};

pub(crate) use source::{SourceSignal, SourceWatermarks};
#[cfg(test)]
pub(crate) use timed_state::timed_state_of_pieces;
pub(crate) use timed_state::{rescale_timed_states, timed_state_pieces};
pub(crate) use timers::{ProcessingTime, TimedFn, TimedFns, TimedKeyedCore, TimedStatePlan};
pub(crate) use watermark::WatermarkState;
