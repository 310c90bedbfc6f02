//! What the keyed layer's unit tests share: a per-key count state.
//!
//! This module owns test fixtures only; it is compiled for tests and never
//! into the library.

/// A per-key count, the state most keyed unit tests use.
#[derive(crate::Snapshot, Default, Debug, Clone, PartialEq)]
#[snapshot(crate = "crate")]
pub(crate) struct Count {
    /// How many times the key was seen (or whatever the test adds).
    pub(crate) count: u64,
}
