//! The Kafka source's position as the source uses it: its offsets per
//! partition in a [`SourcePosition`], and the merge of old subtasks'
//! positions when the source is rescaled.
//!
//! The byte layout itself and its hostile-input checks are in
//! [`crate::connectors::kafka_position`], compiled without this feature
//! so that tools read positions without librdkafka; this module only
//! wraps it in the source's types and errors. It never talks to a broker
//! and never decides which subtask owns a partition.

use super::error::KafkaError;
use crate::connectors::kafka_position;
pub(crate) use crate::connectors::kafka_position::{Offsets, PartitionOffsets};
use crate::source::SourcePosition;

/// The position bytes of `offsets`.
pub(crate) fn encode(offsets: &Offsets) -> SourcePosition {
    SourcePosition::from_bytes(kafka_position::encode(offsets))
}

/// Reads bytes written by [`encode`].
///
/// # Errors
///
/// [`KafkaError::MalformedState`] for anything else.
pub(crate) fn decode(position: &SourcePosition) -> Result<Offsets, KafkaError> {
    kafka_position::decode(position.as_bytes()).map_err(|reason| KafkaError::MalformedState {
        reason: format!("source position: {reason}"),
    })
}

/// One position holding every partition of `positions` (the old
/// subtasks' positions), for every new subtask: each keeps the
/// partitions it owns at its parallelism and ignores the others.
///
/// # Errors
///
/// A message when a position does not decode or a partition appears in
/// two of them.
pub(crate) fn merge(positions: &[SourcePosition]) -> Result<SourcePosition, String> {
    let mut merged = Offsets::new();
    for position in positions {
        for (key, place) in decode(position).map_err(|error| error.to_string())? {
            let (topic, partition) = (key.0.clone(), key.1);
            if merged.insert(key, place).is_some() {
                return Err(format!(
                    "partition {topic}/{partition} is in the positions of two subtasks"
                ));
            }
        }
    }
    Ok(encode(&merged))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::kafka_position::tests::sample;

    #[test]
    fn positions_round_trip_and_merge() {
        let offsets = sample();
        assert_eq!(decode(&encode(&offsets)).expect("decodes"), offsets);
        let mut other = Offsets::new();
        other.insert(
            ("in".into(), 1),
            PartitionOffsets {
                next: 2,
                end: None,
                reads_on: false,
            },
        );
        let merged = merge(&[encode(&offsets), encode(&other)]).expect("merges");
        assert_eq!(decode(&merged).expect("decodes").len(), 3);
        let twice = merge(&[encode(&offsets), encode(&offsets)]);
        assert!(twice
            .expect_err("a partition twice")
            .contains("two subtasks"));
    }
}
