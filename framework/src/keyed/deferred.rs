//! The hand-off of a keyed state's snapshot from the operator's thread to
//! the checkpoint writer: [`DeferredParts`], which yields the parts of the
//! key groups a snapshot took, one at a time, in ascending key group order.
//!
//! This module owns only that trait, its counterpart for an incremental
//! snapshot in slices ([`DeferredSlices`]) and that one's trivial form
//! over slices encoded already ([`ReadySlices`], the flat state's). It never
//! decides which groups a snapshot takes, never encodes anything itself
//! and never does I/O. The copy-on-write state's hand-off
//! ([`super::cow::KeyGroupHandoff`]) implements it; a spilling backend can
//! supply one over a snapshot of its disk store.

use super::group_part::{EncodedSlices, KeyGroupPart};

/// The runtime's error box, named here so that the keyed layer does not
/// reach up into the runtime.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The parts of a snapshot's key groups, produced one at a time on
/// whatever thread holds the value (the checkpoint writer's).
///
/// Each call encodes (or reads) the next key group, ascending, and checks
/// the part before it returns it, so that a caller that writes each part
/// before asking for the next holds one encoded group at a time. After an
/// error the caller must stop: the snapshot fails as a whole.
pub(crate) trait DeferredParts: Send {
    /// The next key group's part, `None` after the last.
    fn next_part(&mut self) -> Option<Result<KeyGroupPart, BoxError>>;
}

/// The fresh slices of each key group of an incremental snapshot of an
/// in-memory state (the copy-on-write hand-off, or [`ReadySlices`] the flat
/// state encoded already), one key group at a time, ascending (every group
/// of the state's range, also those that write no slice), produced on
/// whatever thread holds the value.
pub(crate) trait DeferredSlices: Send {
    /// The next key group's fresh slices, `None` after the last.
    fn next_group(&mut self) -> Option<Result<EncodedSlices, BoxError>>;
}

/// A flat state's fresh slices encoded already (on the operator's thread),
/// handed on in order.
#[derive(Debug)]
pub(crate) struct ReadySlices(std::vec::IntoIter<EncodedSlices>);

impl ReadySlices {
    /// `groups`, ascending by key group, every group of the state's range.
    pub(crate) fn new(groups: Vec<EncodedSlices>) -> Self {
        ReadySlices(groups.into_iter())
    }
}

impl DeferredSlices for ReadySlices {
    fn next_group(&mut self) -> Option<Result<EncodedSlices, BoxError>> {
        self.0.next().map(Ok)
    }
}
