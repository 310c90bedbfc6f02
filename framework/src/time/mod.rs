//! Event time and processing time for users: windows ([`Windows`]:
//! tumbling, sliding and session windows on event or processing time with
//! an incremental aggregate, a reduce or a full-window function, allowed
//! lateness and late records dropped or sent to a stream of their own),
//! [`Timers`] (event-time and processing-time timers of keyed process
//! functions, stored as keyed state by key group so they rescale, fired in
//! timestamp order when the watermark or the clock passes them) and
//! [`StateTtl`] (per-key time-to-live of keyed state), all built on one
//! timed keyed core. The pure bookkeeping of DESIGN.md §7
//! ([`WatermarkStrategy`], [`InputWatermarks`], [`Clock`]) lives in the
//! crate-private `watermark` room below `job` and is re-exported here.
//!
//! This room sits above `job`: its operators are built on `job`'s streams,
//! core and keyed-state envelope, and add themselves to a
//! [`KeyedStream`](crate::job::KeyedStream) from here, so `job` never
//! imports them. It never sends, spawns or blocks and never touches a
//! channel: the shells in `job` carry watermarks in-band and drive the
//! timed core between batches.

mod timed_state;
mod timed_stream;
mod timed_table;
#[cfg(test)]
mod timed_tests;
mod timers;
mod ttl;
mod window;
mod window_fn;
mod window_state;
mod windowed;

pub use crate::watermark::{
    Advance, BoundedOutOfOrderness, Clock, InputWatermarks, ManualClock, Monotonous, Punctuated,
    SystemClock, TimestampFn, WatermarkGenerator, WatermarkStrategy, WATERMARK_MAX_MS,
};
pub use timers::{TimeDomain, Timers};
pub use ttl::{StateTtl, TtlError};
pub use window::{LateRecords, WindowError, Windowed, Windows};
pub use windowed::{
    DropLate, LatePolicy, NoEventTime, SideOutputLate, WindowOutput, WindowedStream,
};

#[cfg(test)]
pub(crate) use timers::{ProcessingTime, TimedFn, TimedFns, TimedKeyedCore};
