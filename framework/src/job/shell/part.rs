//! One subtask's part of a checkpoint as it is stored, and the codec of
//! recorded channel state. It knows nothing of actors or protocol.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::incremental::push_own;
use crate::storage::segment::total_len;
use crate::storage::Segment;
use crate::time::WatermarkState;

/// One subtask's part of a checkpoint, as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct PartBytes {
    /// The operator state (or a source's position).
    pub(crate) state: Vec<u8>,
    /// Recorded channel states: (input channel, postcard `Vec<Vec<In>>`).
    pub(crate) channels: Vec<(u32, Vec<u8>)>,
    /// The subtask's watermarks ([`WatermarkState`] bytes), if it ever had
    /// one. Stored after the other two fields, and only when present, so
    /// that parts without event time keep their old bytes and old parts
    /// still decode.
    #[serde(skip)]
    pub(crate) time: Option<Vec<u8>>,
}

impl PartBytes {
    /// The stored bytes of this part. This, [`PartBytes::decode`],
    /// [`encode_channel`] and [`decode_channel`] hold the part layout;
    /// the shells, rescaling in `physical.rs` and `job::inspect` all go
    /// through them.
    pub(crate) fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut bytes = postcard::to_allocvec(self)?;
        if let Some(time) = &self.time {
            bytes.extend_from_slice(&postcard::to_allocvec(time)?);
        }
        Ok(bytes)
    }

    /// [`PartBytes::encode`] of a part whose state is given as the store's
    /// segments: the same bytes once the segments are concatenated, so
    /// decoding does not know the difference.
    pub(crate) fn encode_segments(
        state: Vec<Segment>,
        channels: &[(u32, Vec<u8>)],
        time: Option<&[u8]>,
    ) -> Result<Vec<Segment>, postcard::Error> {
        // The state field is a postcard byte string: its length, then it.
        let mut segments = vec![Segment::Own(postcard::to_allocvec(&total_len(&state))?)];
        for segment in state {
            match segment {
                Segment::Own(bytes) => push_own(&mut segments, bytes),
                other => segments.push(other),
            }
        }
        push_own(&mut segments, postcard::to_allocvec(channels)?);
        if let Some(time) = time {
            push_own(&mut segments, postcard::to_allocvec(time)?);
        }
        Ok(segments)
    }

    /// Reads bytes written by [`PartBytes::encode`], with or without the
    /// watermarks after the fields.
    pub(crate) fn decode(bytes: &[u8]) -> Result<PartBytes, postcard::Error> {
        let (mut part, rest): (PartBytes, &[u8]) = postcard::take_from_bytes(bytes)?;
        if !rest.is_empty() {
            part.time = Some(postcard::from_bytes(rest)?);
        }
        Ok(part)
    }

    /// The watermarks stored in this part, if any.
    pub(crate) fn watermarks(&self) -> Result<Option<WatermarkState>, postcard::Error> {
        self.time.as_deref().map(WatermarkState::decode).transpose()
    }
}

/// The stored bytes of one recorded channel state: its batches in order.
pub(crate) fn encode_channel<T: Serialize>(batches: &[Vec<T>]) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(batches)
}

/// Reads a recorded channel state written by [`encode_channel`].
pub(crate) fn decode_channel<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Vec<Vec<T>>, postcard::Error> {
    postcard::from_bytes(bytes)
}

/// Whether a recorded channel state (postcard of a list of batches) holds
/// no batch: a postcard sequence starts with its length, so the empty
/// list is the single byte 0.
pub(crate) fn is_empty_channel(messages: &[u8]) -> bool {
    messages == [0]
}

#[cfg(test)]
mod part_tests {
    use super::*;
    use crate::time::InputWatermarks;

    #[test]
    fn parts_without_watermarks_keep_their_old_bytes_and_decode() {
        #[derive(Serialize)]
        struct OldPart {
            state: Vec<u8>,
            channels: Vec<(u32, Vec<u8>)>,
        }
        let old = postcard::to_allocvec(&OldPart {
            state: vec![1, 2, 3],
            channels: vec![(0, vec![0])],
        })
        .expect("encodes");
        let part = PartBytes::decode(&old).expect("an old part decodes");
        assert_eq!(part.state, [1, 2, 3]);
        assert!(part.watermarks().expect("no watermarks").is_none());
        assert_eq!(
            part.encode().expect("encodes"),
            old,
            "same bytes without event time"
        );
    }

    #[test]
    fn a_part_in_segments_concatenates_to_the_encoded_part() {
        let state = vec![
            Segment::Own(vec![1, 2]),
            Segment::Shared(vec![3; 200]),
            Segment::Own(vec![4]),
        ];
        let channels = vec![(0, vec![0]), (1, vec![9, 9])];
        let time = vec![5, 6, 7];
        for time in [None, Some(time.as_slice())] {
            let segments =
                PartBytes::encode_segments(state.clone(), &channels, time).expect("encodes");
            let joined = crate::job::incremental::assemble(&segments, |_| Vec::new());
            let whole = PartBytes {
                state: crate::job::incremental::assemble(&state, |_| Vec::new()),
                channels: channels.clone(),
                time: time.map(<[u8]>::to_vec),
            }
            .encode()
            .expect("encodes");
            assert_eq!(joined, whole);
        }
    }

    #[test]
    fn watermarks_round_trip_after_the_fields() {
        let mut marks = InputWatermarks::new(vec![false, false]);
        let _ = marks.on_watermark(0, 7);
        let _ = marks.on_watermark(1, 9);
        let part = PartBytes {
            state: vec![4],
            channels: Vec::new(),
            time: Some(marks.state().encode().expect("encodes")),
        };
        let back = PartBytes::decode(&part.encode().expect("encodes")).expect("decodes");
        assert_eq!(back.state, [4]);
        assert_eq!(back.watermarks().expect("decodes"), Some(marks.state()));
        let truncated = part.encode().expect("encodes");
        let cut = &truncated[..truncated.len() - 1];
        assert!(
            PartBytes::decode(cut).is_err(),
            "a cut part is an error, not a panic"
        );
    }
}
