//! [`HookedStore`]: a memory checkpoint store whose writes pass through
//! the test's [`StoreHooks`] first, so that a test can fail, hold or
//! record a persist at a chosen point without forwarding every method of
//! [`CheckpointStore`] itself.
//!
//! It owns only the forwarding; what a hook does (and so what a test
//! injects) is the test's. It never changes what the memory store keeps.

use snapflow::storage::{
    CheckpointId, CheckpointKind, CheckpointMetadata, CheckpointPin, CheckpointStore,
    CheckpointSummary, CommitRequest, LoadReport, LoadedCheckpoint, MemoryCheckpointStore, PartId,
    PartInfo, StoreError,
};

/// What a test does at the store's write points, each called before the
/// memory store's own method. Every hook defaults to doing nothing.
pub trait StoreHooks: Send + Sync + std::fmt::Debug {
    /// `begin` of `checkpoint`.
    fn on_begin(&self, _checkpoint: CheckpointId) {}

    /// `write_part` of a part of `checkpoint`: an error is returned in
    /// the part's place (nothing is written).
    fn before_write_part(&self, _checkpoint: CheckpointId) -> Result<(), StoreError> {
        Ok(())
    }

    /// `commit` of `checkpoint`.
    fn before_commit(&self, _checkpoint: CheckpointId) {}
}

/// A [`MemoryCheckpointStore`] whose writes go through `hooks` first.
#[derive(Debug)]
pub struct HookedStore<H> {
    inner: MemoryCheckpointStore,
    /// The test's hooks, and whatever they record.
    pub hooks: H,
}

impl<H: StoreHooks> HookedStore<H> {
    /// An empty store of the job `job`.
    pub fn new(job: &str, hooks: H) -> HookedStore<H> {
        HookedStore {
            inner: MemoryCheckpointStore::new(job).expect("a memory store"),
            hooks,
        }
    }
}

impl<H: StoreHooks> CheckpointStore for HookedStore<H> {
    fn job(&self) -> &str {
        self.inner.job()
    }

    fn begin(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> Result<(), StoreError> {
        self.hooks.on_begin(checkpoint);
        self.inner.begin(checkpoint, kind)
    }

    fn write_part(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        bytes: &[u8],
    ) -> Result<PartInfo, StoreError> {
        self.hooks.before_write_part(checkpoint)?;
        self.inner.write_part(checkpoint, part, bytes)
    }

    fn commit(
        &self,
        checkpoint: CheckpointId,
        request: CommitRequest,
    ) -> Result<CheckpointMetadata, StoreError> {
        self.hooks.before_commit(checkpoint);
        self.inner.commit(checkpoint, request)
    }

    fn discard(&self, checkpoint: CheckpointId) -> Result<(), StoreError> {
        self.inner.discard(checkpoint)
    }

    fn list(&self) -> Result<Vec<CheckpointSummary>, StoreError> {
        self.inner.list()
    }

    fn load(&self, checkpoint: CheckpointId) -> Result<LoadedCheckpoint, StoreError> {
        self.inner.load(checkpoint)
    }

    fn load_latest(&self) -> Result<LoadReport, StoreError> {
        self.inner.load_latest()
    }

    fn pin(&self, checkpoint: CheckpointId) -> Result<CheckpointPin, StoreError> {
        self.inner.pin(checkpoint)
    }
}
