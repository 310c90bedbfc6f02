//! The delegation of every [`CheckpointStore`](crate::storage::CheckpointStore)
//! method to the engine, for the stores built on it. It holds no logic of
//! its own and never adds behaviour: each method forwards as it is.

/// Implements [`CheckpointStore`](super::CheckpointStore) for a type with
/// an `engine: Engine` field by delegation.
macro_rules! delegate_store {
    ($store:ty) => {
        impl $crate::storage::CheckpointStore for $store {
            fn job(&self) -> &str {
                self.engine.job()
            }
            fn begin(
                &self,
                checkpoint: $crate::storage::CheckpointId,
                kind: $crate::storage::CheckpointKind,
            ) -> Result<(), $crate::storage::StoreError> {
                self.engine.begin(checkpoint, kind)
            }
            fn write_part(
                &self,
                checkpoint: $crate::storage::CheckpointId,
                part: &$crate::storage::PartId,
                bytes: &[u8],
            ) -> Result<$crate::storage::PartInfo, $crate::storage::StoreError> {
                self.engine.write_part(checkpoint, part, bytes)
            }
            fn write_part_segments(
                &self,
                checkpoint: $crate::storage::CheckpointId,
                part: &$crate::storage::PartId,
                segments: &[$crate::storage::Segment],
            ) -> Result<$crate::storage::PartInfo, $crate::storage::StoreError> {
                self.engine.write_part_segments(checkpoint, part, segments)
            }
            fn supports_segments(&self) -> bool {
                true
            }
            fn commit(
                &self,
                checkpoint: $crate::storage::CheckpointId,
                request: $crate::storage::CommitRequest,
            ) -> Result<$crate::storage::CheckpointMetadata, $crate::storage::StoreError> {
                self.engine.commit(checkpoint, request)
            }
            fn discard(
                &self,
                checkpoint: $crate::storage::CheckpointId,
            ) -> Result<(), $crate::storage::StoreError> {
                self.engine.discard(checkpoint)
            }
            fn list(
                &self,
            ) -> Result<Vec<$crate::storage::CheckpointSummary>, $crate::storage::StoreError> {
                self.engine.list()
            }
            fn load(
                &self,
                checkpoint: $crate::storage::CheckpointId,
            ) -> Result<$crate::storage::LoadedCheckpoint, $crate::storage::StoreError> {
                self.engine.load(checkpoint)
            }
            fn load_latest(
                &self,
            ) -> Result<$crate::storage::LoadReport, $crate::storage::StoreError> {
                self.engine.load_latest_before(None)
            }
            fn pin(
                &self,
                checkpoint: $crate::storage::CheckpointId,
            ) -> Result<$crate::storage::CheckpointPin, $crate::storage::StoreError> {
                self.engine.pin(checkpoint)
            }
            fn load_latest_before(
                &self,
                before: $crate::storage::CheckpointId,
            ) -> Result<$crate::storage::LoadReport, $crate::storage::StoreError> {
                self.engine.load_latest_before(Some(before))
            }
            fn highest_id(
                &self,
            ) -> Result<Option<$crate::storage::CheckpointId>, $crate::storage::StoreError> {
                self.engine.highest_id()
            }
            fn set_aside(
                &self,
                checkpoint: $crate::storage::CheckpointId,
                reason: &str,
            ) -> Result<Option<std::path::PathBuf>, $crate::storage::StoreError> {
                self.engine.set_aside(checkpoint, reason)
            }
            fn damaged_ids(
                &self,
            ) -> Result<Vec<$crate::storage::CheckpointId>, $crate::storage::StoreError> {
                self.engine.damaged_ids()
            }
            fn location(&self) -> Option<&std::path::Path> {
                self.directory()
            }
        }
    };
}
pub(crate) use delegate_store;
