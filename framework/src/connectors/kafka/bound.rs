//! A bounded partition's end, and what the records a source sees say
//! about it: the decisions alone, with no broker, no queue and no clock.
//!
//! A bounded source takes each partition's end from the broker's latest
//! offset when it first reads the partition. On Kafka that is the high
//! watermark, a batch boundary, and no record at or past it existed
//! then. tansu 0.6 answers with its newest batch's first offset plus one
//! (`kafka_probe.rs`), so on a topic written with normal producer
//! batching the end falls inside the last batch and the records after
//! it were never counted: a source that stopped there read 4 of 20,000
//! records and reported success. So a record at or past the end proves
//! the end wrong: the partition then *reads on* (the source takes that
//! record and every later one) until the broker says it has nothing more
//! (librdkafka's end-of-partition event: its fetch position reached the
//! high watermark, or the last stable offset at `read_committed`, of a
//! fetch answer, which tansu counts in records). The source warns once.
//! On Kafka a record past the end only shows when it was written after
//! the source took its end; the source then reads on to the partition's
//! end at that time, a little more than was there at its start, never
//! less.
//!
//! To see that record at all, the source must look at the message after
//! the one just before the end: the last record of a batch of `max`
//! records is never the one just before the end (see
//! [`stop_before_last`]), so a look always follows it while the rest of
//! its fetch is in the queue (librdkafka hands a fetch answer's records
//! to the queue all at once).

use super::position::PartitionOffsets;

/// Whether a bounded partition has nothing left to read.
pub(super) fn done(offsets: &PartitionOffsets) -> bool {
    !offsets.reads_on && offsets.end.is_some_and(|end| offsets.next >= end)
}

/// What a message at some offset is to a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Below the next offset: an earlier assignment's leftover.
    Leftover,
    /// A record to take.
    Take,
    /// A record to take that proved the partition's end wrong: the
    /// partition reads on from now (warn).
    TakeProvingEndWrong,
    /// Past the end of a partition that is done (a record the fetcher
    /// had queued before the partition was left out).
    PastDone,
}

/// Sorts a message at `offset` for `place`, marking the partition as
/// reading on when the message proves its end wrong.
pub(super) fn on_message(place: &mut PartitionOffsets, offset: i64) -> Seen {
    if offset < place.next {
        return Seen::Leftover;
    }
    match place.end {
        // A partition whose next offset passed its end took a record at
        // or past it before: what follows is what was queued then.
        Some(end) if offset >= end && !place.reads_on && place.next > end => Seen::PastDone,
        // The first record at or past the end (offsets below it that
        // never came were transaction markers).
        Some(end) if offset >= end && !place.reads_on => {
            place.reads_on = true;
            Seen::TakeProvingEndWrong
        }
        _ => Seen::Take,
    }
}

/// The broker said the partition has nothing more at this moment (an
/// end-of-partition event), with the consumer's position `position`: a
/// partition reading on ends there.
pub(super) fn at_broker_end(place: &mut PartitionOffsets, position: Option<i64>) {
    if place.reads_on {
        let end = position.map_or(place.next, |at| at.max(place.next));
        place.next = end;
        place.end = Some(end);
        place.reads_on = false;
    }
}

/// Whether a read that has taken `produced` of `max` records stops
/// before taking one more: it does when that one would be the last of
/// the batch and the one just before the end, so that the next look,
/// which may show the end wrong, happens within the same read. A batch
/// of one record cannot keep a slot free, and takes it.
pub(super) fn stop_before_last(place: &PartitionOffsets, produced: usize, max: usize) -> bool {
    max > 1
        && produced + 1 == max
        && !place.reads_on
        && place.end.is_some_and(|end| place.next + 1 == end)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounded(next: i64, end: i64) -> PartitionOffsets {
        PartitionOffsets {
            next,
            end: Some(end),
            reads_on: false,
        }
    }

    fn check(place: PartitionOffsets, offset: i64, seen: Seen, reads_on: bool) {
        let mut place = place;
        assert_eq!(
            on_message(&mut place, offset),
            seen,
            "{place:?} at {offset}"
        );
        assert_eq!(place.reads_on, reads_on, "{place:?} at {offset}");
    }

    #[test]
    fn messages_are_sorted_against_the_next_offset_and_the_end() {
        check(bounded(5, 10), 4, Seen::Leftover, false);
        check(bounded(5, 10), 5, Seen::Take, false);
        check(bounded(5, 10), 9, Seen::Take, false);
        check(bounded(10, 10), 10, Seen::TakeProvingEndWrong, true);
        check(bounded(10, 10), 12, Seen::TakeProvingEndWrong, true);
        check(bounded(8, 10), 11, Seen::TakeProvingEndWrong, true);
        check(bounded(12, 10), 12, Seen::PastDone, false);
        let unbounded = PartitionOffsets {
            next: 3,
            end: None,
            reads_on: false,
        };
        check(unbounded, 1_000, Seen::Take, false);
        let mut on = bounded(10, 10);
        on.reads_on = true;
        check(on, 50, Seen::Take, true);
    }

    /// A partition reading on is not done at its old end and ends where
    /// the broker said it has nothing more; one that does not read on
    /// ignores the event.
    #[test]
    fn a_partition_reading_on_ends_at_the_broker_end() {
        let mut place = bounded(1, 1);
        assert!(done(&place));
        assert_eq!(on_message(&mut place, 1), Seen::TakeProvingEndWrong);
        place.next = 5_000;
        assert!(!done(&place));
        at_broker_end(&mut place, Some(5_002));
        assert_eq!(place, bounded(5_002, 5_002));
        assert!(done(&place));
        let mut exact = bounded(7, 9);
        at_broker_end(&mut exact, Some(9));
        assert_eq!(exact, bounded(7, 9));
        let mut on = bounded(10, 10);
        on.reads_on = true;
        at_broker_end(&mut on, None);
        assert_eq!(on, bounded(10, 10));
    }

    #[test]
    fn the_last_slot_of_a_read_is_never_the_record_before_the_end() {
        assert!(stop_before_last(&bounded(9, 10), 31, 32));
        assert!(!stop_before_last(&bounded(9, 10), 30, 32));
        assert!(!stop_before_last(&bounded(8, 10), 31, 32));
        assert!(!stop_before_last(&bounded(9, 10), 0, 1), "one slot");
        let mut on = bounded(9, 10);
        on.reads_on = true;
        assert!(!stop_before_last(&on, 31, 32));
    }
}
