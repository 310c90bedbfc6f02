//! Asynchronous snapshots, the shell's side: a subtask's state as taken at
//! its snapshot ([`TakenState`]), which may be bytes already or a handoff
//! of immutable state to encode later, and its part of a checkpoint as it
//! travels to the checkpoint writer ([`PendingPart`]).
//!
//! This module owns the types and the one place where a deferred state
//! becomes the store's segments ([`PendingPart::encode`], called on the
//! writer thread). It never decides what a core hands off (the cores do),
//! never does I/O and never talks to the protocol machines.

use crate::runtime::BoxError;
use crate::storage::segment::total_len;
use crate::storage::Segment;

use super::part::PartBytes;

/// A state taken at a snapshot and encoded later, off the operator's
/// thread: it must not change after it was taken (the keyed cores hand off
/// copy-on-write key groups, [`crate::keyed::cow`]).
pub(crate) trait DeferredState: Send + 'static {
    /// The state as the store's segments, exactly what
    /// [`super::Core::snapshot_segments`] would have returned at the
    /// snapshot.
    fn encode(self: Box<Self>) -> Result<Vec<Segment>, BoxError>;
}

/// A core's state of one checkpoint, as taken at its snapshot.
pub(crate) enum TakenState {
    /// Already the store's segments (encoded on the operator's thread).
    Segments(Vec<Segment>),
    /// To be encoded on the checkpoint writer's thread.
    Deferred(Box<dyn DeferredState>),
}

impl std::fmt::Debug for TakenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TakenState::Segments(segments) => write!(f, "Segments({} bytes)", total_len(segments)),
            TakenState::Deferred(_) => f.write_str("Deferred"),
        }
    }
}

/// One subtask's part of a checkpoint on its way to the writer.
pub(crate) enum PendingPart {
    /// The part as the store's segments.
    Ready(Vec<Segment>),
    /// The part whose state is still to be encoded; its recorded channels
    /// and watermarks are bytes already (they are small and were taken on
    /// the operator's thread).
    Deferred {
        state: Box<dyn DeferredState>,
        channels: Vec<(u32, Vec<u8>)>,
        time: Option<Vec<u8>>,
    },
}

impl std::fmt::Debug for PendingPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PendingPart::Ready(segments) => write!(f, "Ready({} bytes)", total_len(segments)),
            PendingPart::Deferred { channels, .. } => {
                write!(f, "Deferred({} recorded channels)", channels.len())
            }
        }
    }
}

impl PendingPart {
    /// The part of a state taken at the snapshot, its recorded channel
    /// states and its watermarks: encoded now when the state is bytes,
    /// later otherwise.
    pub(crate) fn new(
        state: TakenState,
        channels: Vec<(u32, Vec<u8>)>,
        time: Option<Vec<u8>>,
    ) -> Result<Self, BoxError> {
        Ok(match state {
            TakenState::Segments(state) => PendingPart::Ready(PartBytes::encode_segments(
                state,
                &channels,
                time.as_deref(),
            )?),
            TakenState::Deferred(state) => PendingPart::Deferred {
                state,
                channels,
                time,
            },
        })
    }

    /// The part's size in bytes, when it is known (not before a deferred
    /// state is encoded).
    pub(crate) fn known_len(&self) -> Option<u64> {
        match self {
            PendingPart::Ready(segments) => Some(total_len(segments)),
            PendingPart::Deferred { .. } => None,
        }
    }

    /// The part as the store's segments, encoding a deferred state: the
    /// same segments as a part encoded at the snapshot. Runs on the
    /// checkpoint writer's thread.
    pub(crate) fn encode(self) -> Result<Vec<Segment>, BoxError> {
        match self {
            PendingPart::Ready(segments) => Ok(segments),
            PendingPart::Deferred {
                state,
                channels,
                time,
            } => Ok(PartBytes::encode_segments(
                state.encode()?,
                &channels,
                time.as_deref(),
            )?),
        }
    }
}
