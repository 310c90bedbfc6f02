//! One subtask's part of a checkpoint as it is stored, and the codec of
//! recorded channel state. It knows nothing of actors or protocol.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::event::InputItem;
use crate::job::incremental::push_own;
use crate::storage::segment::total_len;
use crate::storage::Segment;
use crate::watermark::WatermarkState;

/// One subtask's part of a checkpoint, as stored.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct PartBytes {
    /// The operator state (or a source's position).
    #[serde(deserialize_with = "byte_string")]
    pub(crate) state: Vec<u8>,
    /// Recorded channel states: (input channel, [`encode_channel`] bytes).
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

/// Reads a byte string in one copy. Serde reads a `Vec<u8>` as a sequence,
/// one byte at a time: about 60 ms per subtask for the 29 MB state of a
/// spilling restore at 10 M keys (BENCHMARKS.md at 07a44e5, "A restore that copies
/// entries"). In postcard both are the same bytes (a varint length, then
/// the bytes), so parts written before read the same.
fn byte_string<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
    struct ByteString;
    impl serde::de::Visitor<'_> for ByteString {
        type Value = Vec<u8>;

        fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            formatter.write_str("a byte string")
        }

        fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<Vec<u8>, E> {
            Ok(bytes.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<Vec<u8>, E> {
            Ok(bytes)
        }
    }
    deserializer.deserialize_byte_buf(ByteString)
}

/// The layout tag of a recorded channel state that holds time marks: such
/// a state is stored as `[0, CHANNEL_LAYOUT_MARKED]` and then the postcard
/// of its `Vec<InputItem<T>>`. A state of records alone keeps the first
/// layout (postcard of its `Vec<Vec<T>>`, no tag), whose only encoding
/// starting with byte 0 is the single byte of the empty list, so the two
/// never share bytes and checkpoints written before time marks were kept
/// still restore.
const CHANNEL_LAYOUT_MARKED: u8 = 2;

/// A recorded channel state that does not decode.
#[derive(Debug)]
pub(crate) enum ChannelStateError {
    /// The state names a layout this build does not know (a newer one).
    UnknownLayout { layout: u8 },
    /// The bytes do not decode as the records of this channel.
    Malformed(postcard::Error),
}

impl std::fmt::Display for ChannelStateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelStateError::UnknownLayout { layout } => write!(
                f,
                "recorded channel state of layout {layout}; this build reads layouts 1 and \
                 {CHANNEL_LAYOUT_MARKED}"
            ),
            ChannelStateError::Malformed(error) => {
                write!(f, "recorded channel state does not decode: {error}")
            }
        }
    }
}

impl std::error::Error for ChannelStateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ChannelStateError::UnknownLayout { .. } => None,
            ChannelStateError::Malformed(error) => Some(error),
        }
    }
}

/// The stored bytes of a channel state of records alone: its batches in
/// order (the first layout).
pub(crate) fn encode_batches<T: Serialize>(batches: &[Vec<T>]) -> Result<Vec<u8>, postcard::Error> {
    postcard::to_allocvec(batches)
}

/// The stored bytes of one recorded channel state: its items in order,
/// in the first layout when it holds no time mark (so a job without event
/// time writes the bytes it always wrote).
pub(crate) fn encode_channel<T: Serialize>(
    items: &[InputItem<T>],
) -> Result<Vec<u8>, postcard::Error> {
    let mut batches = Vec::with_capacity(items.len());
    for item in items {
        match item {
            InputItem::Records(batch) => batches.push(batch),
            InputItem::Watermark(_) | InputItem::Idle => {
                let mut bytes = vec![0, CHANNEL_LAYOUT_MARKED];
                bytes.extend_from_slice(&postcard::to_allocvec(items)?);
                return Ok(bytes);
            }
        }
    }
    postcard::to_allocvec(&batches)
}

/// Reads a recorded channel state written by [`encode_channel`] or
/// [`encode_batches`], in either layout.
pub(crate) fn decode_channel<T: DeserializeOwned>(
    bytes: &[u8],
) -> Result<Vec<InputItem<T>>, ChannelStateError> {
    match bytes {
        [0, CHANNEL_LAYOUT_MARKED, items @ ..] => {
            postcard::from_bytes(items).map_err(ChannelStateError::Malformed)
        }
        [0, layout, ..] => Err(ChannelStateError::UnknownLayout { layout: *layout }),
        _ => {
            let batches: Vec<Vec<T>> =
                postcard::from_bytes(bytes).map_err(ChannelStateError::Malformed)?;
            Ok(batches.into_iter().map(InputItem::Records).collect())
        }
    }
}

/// Whether a recorded channel state holds nothing: the empty list of the
/// first layout is the single byte 0 (a postcard sequence starts with its
/// length), and the marked layout is never written empty.
pub(crate) fn is_empty_channel(messages: &[u8]) -> bool {
    messages == [0]
}

#[cfg(test)]
mod part_tests {
    use super::*;
    use crate::watermark::InputWatermarks;

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

    #[test]
    fn channel_states_keep_their_marks_in_order_and_old_layouts_decode() {
        let records_only = vec![
            InputItem::Records(vec![1_u64, 2]),
            InputItem::Records(vec![3]),
        ];
        let old = postcard::to_allocvec(&vec![vec![1_u64, 2], vec![3]]).expect("encodes");
        assert_eq!(
            encode_channel(&records_only).expect("encodes"),
            old,
            "records alone keep the first layout"
        );
        assert_eq!(decode_channel::<u64>(&old).expect("decodes"), records_only);
        let marked = vec![
            InputItem::Records(vec![1_u64]),
            InputItem::Watermark(10),
            InputItem::Records(vec![2]),
            InputItem::Idle,
        ];
        let bytes = encode_channel(&marked).expect("encodes");
        assert_eq!(&bytes[..2], &[0, CHANNEL_LAYOUT_MARKED]);
        assert!(!is_empty_channel(&bytes));
        assert_eq!(decode_channel::<u64>(&bytes).expect("decodes"), marked);
        let empty = encode_channel::<u64>(&[]).expect("encodes");
        assert!(is_empty_channel(&empty));
        assert!(decode_channel::<u64>(&empty).expect("decodes").is_empty());
    }

    #[test]
    fn an_unknown_or_damaged_channel_layout_is_a_typed_error() {
        let error = decode_channel::<u64>(&[0, 9, 1]).expect_err("layout 9 is unknown");
        assert!(matches!(
            error,
            ChannelStateError::UnknownLayout { layout: 9 }
        ));
        assert!(error.to_string().contains("layout 9"), "{error}");
        let cut = decode_channel::<u64>(&[0, CHANNEL_LAYOUT_MARKED, 1]).expect_err("cut");
        assert!(matches!(cut, ChannelStateError::Malformed(_)));
        assert!(
            decode_channel::<u64>(&[5, 1]).is_err(),
            "a cut first layout"
        );
    }
}
