//! The stored layout of a timed keyed operator (windows, timers, state
//! time-to-live): the user's keyed-state envelope, the timers'
//! keyed-state envelope and the watermark, and its codec.
//!
//! This module owns only that layout, so that `job::inspect` can describe
//! a timed operator's state and `time`'s timed core can write and rescale
//! it, without `job` importing `time`. It never takes, frames or plans a
//! snapshot (`time`'s `timed_state.rs` and `timed_table.rs` do) and never
//! does I/O.

use serde::{Deserialize, Serialize};

/// The stored state of a timed keyed operator: the user's key groups, the
/// timers' key groups (both in the keyed-state envelope of
/// this room), and the watermark the core last saw. This,
/// [`decode_timed_state`] and `TimedSnapshot::encode` in `time` (which writes the
/// same bytes as segments) are the only places that know this layout.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct TimedState {
    /// The user's per-key state, in the keyed-state envelope.
    pub(crate) user: Vec<u8>,
    /// The timers, in the keyed-state envelope.
    pub(crate) timers: Vec<u8>,
    /// The watermark the core had seen, `None` before the first.
    pub(crate) watermark_ms: Option<u64>,
}

/// The stored bytes of a timed state (postcard).
pub(crate) fn encode_timed_state(state: &TimedState) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(state)
}

/// Reads the bytes [`encode_timed_state`] (or a [`TimedSnapshot`]) wrote.
pub(crate) fn decode_timed_state(bytes: &[u8]) -> Result<TimedState, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// A stored timed state made of its pieces, as [`timed_state_pieces`]
/// gives them back: for tests of readers that have no types.
#[cfg(test)]
pub(crate) fn timed_state_of_pieces(
    user: Vec<u8>,
    timers: Vec<u8>,
    watermark_ms: Option<u64>,
) -> Vec<u8> {
    encode_timed_state(&TimedState {
        user,
        timers,
        watermark_ms,
    })
    .expect("a timed state encodes")
}

/// A stored timed state's pieces, for describing it without its types
/// (`job::inspect`'s layout): the user's keyed-state bytes, the timers'
/// keyed-state bytes and the watermark. `None` unless `bytes` are exactly
/// one timed state, nothing after it.
pub(crate) fn timed_state_pieces(bytes: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Option<u64>)> {
    let (state, rest): (TimedState, &[u8]) = postcard::take_from_bytes(bytes).ok()?;
    rest.is_empty()
        .then_some((state.user, state.timers, state.watermark_ms))
}
