//! The stored state of a timed keyed operator (windows, timers, state
//! time-to-live): its layout ([`TimedState`]: the user's keyed-state
//! envelope, the timers' keyed-state envelope, the watermark), its
//! rescaling, and its snapshot at a checkpoint as the store's segments
//! ([`TimedSnapshot`]), taken on the operator's thread and encoded on the
//! checkpoint writer's when either table is copy-on-write or written
//! incrementally.
//!
//! This module owns the framing of the two tables' segments
//! into it, so that a snapshot written as segments (own, shared and
//! reused bytes) assembles to exactly the bytes [`encode_timed_state`]
//! gives for the same tables (the layout itself is
//! `job::timed_layout`'s, so that `job::inspect` reads it without
//! importing `time`): restoring, rescaling and `job::inspect`
//! read checkpoints written before and after asynchronous snapshots
//! alike. It never takes a table (`timed_table.rs` does), never plans
//! what is written (the ledgers of `job::incremental` do) and never does
//! I/O.

use crate::job::{push_own, DeferredState, TakenState};
use crate::runtime::BoxError;
use crate::storage::segment::total_len;
use crate::storage::Segment;

use super::timed_table::TakenTable;

pub(crate) use crate::job::timed_layout::{decode_timed_state, encode_timed_state, TimedState};

/// The stored states of the old subtasks of a timed operator, for
/// `parallelism` new subtasks: each gets the union of the key groups (it
/// keeps its own range on restore), and the lowest watermark any old
/// subtask had seen (`None` if one had none), which no new subtask has
/// passed.
pub(crate) fn rescale_timed_states(
    states: &[Vec<u8>],
    parallelism: usize,
) -> Result<Vec<Vec<u8>>, String> {
    let decoded = states
        .iter()
        .map(|state| decode_timed_state(state).map_err(|error| error.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let users: Vec<Vec<u8>> = decoded.iter().map(|state| state.user.clone()).collect();
    let timers: Vec<Vec<u8>> = decoded.iter().map(|state| state.timers.clone()).collect();
    let watermark_ms = decoded
        .iter()
        .map(|state| state.watermark_ms)
        .min()
        .flatten();
    let merged = TimedState {
        user: crate::job::merge_keyed_states(&users)?,
        timers: crate::job::merge_keyed_states(&timers)?,
        watermark_ms,
    };
    let bytes = encode_timed_state(&merged).map_err(|error| error.to_string())?;
    Ok(vec![bytes; parallelism])
}

/// A timed core's snapshot of one checkpoint: both tables as taken on
/// the operator's thread, and the watermark. Encoded into the store's
/// segments by [`TimedSnapshot::encode`], at once when both tables are
/// bytes already (flat and full), otherwise on the checkpoint writer's
/// thread.
pub(crate) struct TimedSnapshot {
    /// The user's per-key state.
    pub(crate) user: TakenTable,
    /// The timers.
    pub(crate) timers: TakenTable,
    /// The watermark the core had seen.
    pub(crate) watermark_ms: Option<u64>,
}

impl TimedSnapshot {
    /// The snapshot as a core's taken state: encoded now when nothing is
    /// left to the writer, deferred otherwise.
    pub(crate) fn into_taken(self) -> Result<TakenState, BoxError> {
        if self.user.is_ready() && self.timers.is_ready() {
            return Ok(TakenState::Segments(self.encode()?));
        }
        Ok(TakenState::Deferred(Box::new(self)))
    }

    /// The segments of a [`TimedState`]: each table's length (postcard's
    /// varint, as for a byte vector) and its envelope's segments, then the
    /// watermark, so the part assembles to the bytes of
    /// [`encode_timed_state`]. The user state's shared bytes come first in
    /// the part's shared file, the timers' after them, so the timers' are
    /// encoded at the user state's shared length.
    pub(crate) fn encode(self) -> Result<Vec<Segment>, BoxError> {
        let user = self.user.encode_at(0)?;
        let timers = self.timers.encode_at(shared_len(&user))?;
        let mut segments = Vec::new();
        push_field(&mut segments, user)?;
        push_field(&mut segments, timers)?;
        push_own(&mut segments, postcard::to_allocvec(&self.watermark_ms)?);
        Ok(segments)
    }
}

impl DeferredState for TimedSnapshot {
    fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError> {
        (*self).encode()
    }
}

/// How many bytes `segments` put into the part's shared file.
fn shared_len(segments: &[Segment]) -> u64 {
    segments
        .iter()
        .map(|segment| match segment {
            Segment::Shared(bytes) => bytes.len() as u64,
            Segment::Own(_) | Segment::Reuse(_) => 0,
        })
        .sum()
}

/// Appends one byte-vector field of a [`TimedState`]: its length as
/// postcard writes a vector's, then its segments.
fn push_field(segments: &mut Vec<Segment>, field: Vec<Segment>) -> Result<(), postcard::Error> {
    push_own(segments, postcard::to_allocvec(&total_len(&field))?);
    for segment in field {
        match segment {
            Segment::Own(bytes) => push_own(segments, bytes),
            other => segments.push(other),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rescaling_keeps_the_lowest_watermark() {
        let state = |watermark_ms| {
            let empty = crate::job::encode_keyed_state(&[]).expect("encodes");
            encode_timed_state(&TimedState {
                user: empty.clone(),
                timers: empty,
                watermark_ms,
            })
            .expect("encodes")
        };
        let rescaled =
            rescale_timed_states(&[state(Some(9)), state(Some(4))], 3).expect("rescales");
        assert_eq!(rescaled.len(), 3);
        let first = decode_timed_state(&rescaled[0]).expect("decodes");
        assert_eq!(first.watermark_ms, Some(4));
        let none = rescale_timed_states(&[state(Some(9)), state(None)], 1).expect("rescales");
        assert_eq!(
            decode_timed_state(&none[0]).expect("decodes").watermark_ms,
            None
        );
    }
}
