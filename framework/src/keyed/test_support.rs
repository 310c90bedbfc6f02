//! Fixtures shared by the keyed-state unit tests (the in-memory backend,
//! the spilling backend, incremental checkpoints). Compiled for tests
//! only; it owns no behaviour.

/// A per-key count, the state the unit tests keep.
#[derive(crate::Snapshot, Default, Debug, Clone, PartialEq)]
#[snapshot(crate = "crate")]
pub(crate) struct Count {
    /// How many times the key was seen (or whatever the test adds).
    pub(crate) count: u64,
}
