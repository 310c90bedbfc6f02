//! The watermark machinery of one source subtask: a generator per split
//! it reads, the subtask's watermark as the minimum over its active
//! splits, idleness per split and of the subtask, the emit interval, and
//! what a snapshot keeps (the watermark sent on).
//!
//! It is pure bookkeeping on the source's actor: the source shell hands
//! it each poll's records and the splits the source reports, and sends
//! what it returns. It never reads a source or touches a channel.

use crate::source::SplitId;

use super::merge::WatermarkState;
use super::strategy::{WatermarkGenerator, WatermarkStrategy};

/// What a source subtask must send after it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SourceSignal {
    /// Nothing.
    None,
    /// This watermark, after the records just read.
    Watermark(u64),
    /// An idleness mark.
    Idle,
}

/// One split's generator and quiet time.
struct SplitWatermark<T> {
    split: SplitId,
    generator: Box<dyn WatermarkGenerator<T>>,
    /// When (processing time) the split last read, or appeared; `None`
    /// until the first poll that looks, and always without an idleness
    /// timeout.
    active_at_ms: Option<u64>,
    /// Quiet for the idleness timeout: it holds nothing back.
    idle: bool,
    /// The highest watermark the generator returned: a lower one later is
    /// ignored (this one stands) and counted.
    highest_ms: Option<u64>,
    /// What the generator returned when last asked, so that a lower value
    /// it keeps returning is counted once.
    last_ms: Option<u64>,
}

impl<T> SplitWatermark<T> {
    /// The split's watermark: the generator's, unless it went back below
    /// what it returned before; then that (counted in `regressions`).
    fn watermark_ms(&mut self, regressions: &mut u64) -> Option<u64> {
        let now_ms = self.generator.current_watermark_ms();
        let went_back = match (self.highest_ms, now_ms) {
            (Some(highest), Some(now)) => now < highest,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if went_back && now_ms != self.last_ms {
            *regressions += 1;
        }
        self.last_ms = now_ms;
        if !went_back {
            self.highest_ms = now_ms;
        }
        self.highest_ms
    }
}

/// The watermark machinery of one source subtask.
pub(crate) struct SourceWatermarks<T> {
    strategy: WatermarkStrategy<T>,
    /// The splits the source last reported, in its order. Bounded by the
    /// splits one subtask reads (one for the built-in sources).
    splits: Vec<SplitWatermark<T>>,
    sent_ms: Option<u64>,
    last_emit_at_ms: Option<u64>,
    idle_sent: bool,
    /// How often a split's generator went back below a watermark it had
    /// returned (DESIGN.md §7: ignored, and counted).
    regressions: u64,
}

impl<T: 'static> SourceWatermarks<T> {
    pub(crate) fn new(strategy: WatermarkStrategy<T>) -> Self {
        SourceWatermarks {
            strategy,
            splits: Vec::new(),
            sent_ms: None,
            last_emit_at_ms: None,
            idle_sent: false,
            regressions: 0,
        }
    }

    /// How often a generator went back below what it had returned; such a
    /// value is ignored. A generator starts afresh after a restore and
    /// for a new split, so that is no regression.
    pub(crate) fn regressions(&self) -> u64 {
        self.regressions
    }

    /// A source of one split (id 0) read `records` (possibly none): the
    /// built-in sources, and the unit tests.
    #[cfg(test)]
    pub(crate) fn on_records(&mut self, records: &[T]) -> SourceSignal {
        self.on_poll(records, 0, &[0])
    }

    /// The subtask read `records` (possibly none) from split `split`, and
    /// now reads the splits `current` (empty: none at all).
    pub(crate) fn on_poll(
        &mut self,
        records: &[T],
        split: SplitId,
        current: &[SplitId],
    ) -> SourceSignal {
        self.sync_splits(current);
        if self.splits.is_empty() {
            return self.idle_once();
        }
        let read = if records.is_empty() {
            None
        } else {
            self.splits.iter().position(|state| state.split == split)
        };
        if let Some(index) = read {
            self.read(index, records);
            // Records end an idle spell downstream by themselves (they
            // make an idle input active again), so the next quiet spell
            // needs a new mark.
            self.idle_sent = false;
        }
        if self.strategy.idleness_ms.is_some() {
            self.age_quiet_splits(read);
        }
        if self.splits.iter().all(|state| state.idle) {
            return self.idle_once();
        }
        self.rise()
    }

    /// Keeps one state per split in `current`, in its order: new splits
    /// get a fresh generator, splits no longer read are dropped.
    fn sync_splits(&mut self, current: &[SplitId]) {
        let same = self.splits.len() == current.len()
            && self
                .splits
                .iter()
                .zip(current)
                .all(|(state, id)| state.split == *id);
        if same {
            return;
        }
        let mut old = std::mem::take(&mut self.splits);
        for &split in current {
            let state = match old.iter().position(|state| state.split == split) {
                Some(index) => old.swap_remove(index),
                None => SplitWatermark {
                    split,
                    generator: (self.strategy.make_generator)(),
                    active_at_ms: None,
                    idle: false,
                    highest_ms: None,
                    last_ms: None,
                },
            };
            self.splits.push(state);
        }
    }

    /// Feeds the records of split `index` to its generator.
    fn read(&mut self, index: usize, records: &[T]) {
        let state = &mut self.splits[index];
        state.idle = false;
        state
            .generator
            .on_events(records, self.strategy.timestamp_fn());
    }

    /// The split just read (if any) was active now; every other split has
    /// been quiet since it last read (or since it appeared), and past the
    /// idleness timeout it is idle.
    fn age_quiet_splits(&mut self, read: Option<usize>) {
        let Some(idleness_ms) = self.strategy.idleness_ms else {
            return;
        };
        let now_ms = self.strategy.clock.now_ms();
        for (index, state) in self.splits.iter_mut().enumerate() {
            if Some(index) == read {
                state.active_at_ms = Some(now_ms);
                continue;
            }
            let since_ms = *state.active_at_ms.get_or_insert(now_ms);
            if now_ms.saturating_sub(since_ms) >= idleness_ms {
                state.idle = true;
            }
        }
    }

    /// The idleness mark, once per idle spell.
    fn idle_once(&mut self) -> SourceSignal {
        if self.idle_sent {
            return SourceSignal::None;
        }
        self.idle_sent = true;
        SourceSignal::Idle
    }

    /// The watermark to send when the minimum over the active splits rose
    /// (a split without a watermark yet holds it back), within the emit
    /// interval.
    fn rise(&mut self) -> SourceSignal {
        let mut merged = Some(u64::MAX);
        for state in self.splits.iter_mut().filter(|state| !state.idle) {
            // Every active split is asked, so each one's regressions count.
            let split_ms = state.watermark_ms(&mut self.regressions);
            merged = merged.zip(split_ms).map(|(low, ms)| low.min(ms));
        }
        let Some(watermark_ms) = merged else {
            return SourceSignal::None;
        };
        if self.sent_ms.is_some_and(|sent| watermark_ms <= sent) {
            return SourceSignal::None;
        }
        let interval_ms = self.strategy.emit_interval_ms;
        if interval_ms > 0 {
            let now_ms = self.strategy.clock.now_ms();
            if self
                .last_emit_at_ms
                .is_some_and(|at| now_ms.saturating_sub(at) < interval_ms)
            {
                return SourceSignal::None;
            }
            self.last_emit_at_ms = Some(now_ms);
        }
        self.sent_ms = Some(watermark_ms);
        SourceSignal::Watermark(watermark_ms)
    }

    /// What a snapshot keeps: the watermark sent on.
    pub(crate) fn state(&self) -> WatermarkState {
        WatermarkState::sent(self.sent_ms)
    }

    /// Resumes from a snapshot: never sends below what was sent.
    pub(crate) fn restore(&mut self, state: &WatermarkState) {
        self.sent_ms = state.output_ms();
    }
}

#[cfg(test)]
mod tests {
    use super::super::clock::ManualClock;
    use super::*;

    fn run(strategy: WatermarkStrategy<u64>, batches: &[&[u64]]) -> Vec<SourceSignal> {
        let mut marks = SourceWatermarks::new(strategy);
        batches
            .iter()
            .map(|batch| marks.on_records(batch))
            .collect()
    }

    #[test]
    fn bounded_out_of_orderness_is_max_minus_bound_minus_one() {
        let strategy = WatermarkStrategy::bounded_out_of_orderness(5, |ts: &u64| *ts);
        assert_eq!(
            run(strategy, &[&[3], &[6], &[10, 7], &[8], &[12]]),
            [
                SourceSignal::None,
                SourceSignal::Watermark(0),
                SourceSignal::Watermark(4),
                SourceSignal::None,
                SourceSignal::Watermark(6),
            ]
        );
    }

    #[test]
    fn arithmetic_saturates() {
        let huge = WatermarkStrategy::bounded_out_of_orderness(u64::MAX, |ts: &u64| *ts);
        assert_eq!(run(huge, &[&[u64::MAX]]), [SourceSignal::None]);
        let zero = WatermarkStrategy::monotonous(|ts: &u64| *ts);
        assert_eq!(
            run(zero, &[&[0], &[u64::MAX]]),
            [SourceSignal::None, SourceSignal::Watermark(u64::MAX - 1)]
        );
    }

    #[test]
    fn punctuated_marks_come_from_records() {
        let strategy = WatermarkStrategy::punctuated(
            |ts: &u64| *ts,
            |_: &u64, ts| (ts % 10 == 0).then_some(ts),
        );
        assert_eq!(
            run(strategy, &[&[3], &[10], &[12], &[20]]),
            [
                SourceSignal::None,
                SourceSignal::Watermark(10),
                SourceSignal::None,
                SourceSignal::Watermark(20),
            ]
        );
    }

    #[test]
    fn idleness_after_its_timeout_and_once() {
        let clock = ManualClock::new(100);
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts)
            .with_idleness(50)
            .with_clock(clock.clone());
        let mut marks = SourceWatermarks::new(strategy);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        clock.advance_ms(49);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        clock.advance_ms(1);
        assert_eq!(marks.on_records(&[]), SourceSignal::Idle);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        assert_eq!(marks.on_records(&[5]), SourceSignal::Watermark(4));
        clock.advance_ms(49);
        assert_eq!(
            marks.on_records(&[]),
            SourceSignal::None,
            "the quiet time counts from the last read again"
        );
        clock.advance_ms(1);
        assert_eq!(marks.on_records(&[]), SourceSignal::Idle);
    }

    #[test]
    fn emit_interval_holds_rises_back() {
        let clock = ManualClock::new(0);
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts)
            .with_emit_interval_ms(10)
            .with_clock(clock.clone());
        let mut marks = SourceWatermarks::new(strategy);
        assert_eq!(marks.on_records(&[5]), SourceSignal::Watermark(4));
        assert_eq!(marks.on_records(&[6]), SourceSignal::None);
        clock.advance_ms(10);
        assert_eq!(marks.on_records(&[7]), SourceSignal::Watermark(6));
    }

    #[test]
    fn a_restored_subtask_never_sends_below_what_it_sent() {
        let strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts);
        let mut before = SourceWatermarks::new(strategy.clone());
        assert_eq!(before.on_records(&[10]), SourceSignal::Watermark(9));
        let mut after = SourceWatermarks::new(strategy);
        after.restore(&before.state());
        assert_eq!(after.on_records(&[8]), SourceSignal::None);
        assert_eq!(after.on_records(&[11]), SourceSignal::Watermark(10));
    }

    /// The watermark is the last record's event time minus one, so it
    /// goes back when an older record comes.
    struct LastSeen(Option<u64>);

    impl WatermarkGenerator<u64> for LastSeen {
        fn on_event(&mut self, _record: &u64, timestamp_ms: u64) {
            self.0 = Some(timestamp_ms);
        }

        fn current_watermark_ms(&self) -> Option<u64> {
            self.0?.checked_sub(1)
        }
    }

    #[test]
    fn a_generator_that_goes_back_is_ignored_and_counted_once_per_drop() {
        let strategy = WatermarkStrategy::custom(|ts: &u64| *ts, || LastSeen(None));
        let mut marks = SourceWatermarks::new(strategy);
        assert_eq!(marks.on_records(&[10]), SourceSignal::Watermark(9));
        assert_eq!(marks.on_records(&[5]), SourceSignal::None);
        assert_eq!(marks.regressions(), 1);
        assert_eq!(marks.on_records(&[5]), SourceSignal::None);
        assert_eq!(marks.on_records(&[]), SourceSignal::None);
        assert_eq!(marks.regressions(), 1, "the same lower value counts once");
        assert_eq!(marks.on_records(&[12]), SourceSignal::Watermark(11));
        assert_eq!(marks.on_records(&[3]), SourceSignal::None);
        assert_eq!(marks.on_records(&[4]), SourceSignal::None);
        assert_eq!(marks.regressions(), 3, "every new lower value counts");
        assert_eq!(
            marks.on_records(&[13]),
            SourceSignal::Watermark(12),
            "the highest stands while it is below"
        );
    }

    #[test]
    fn a_split_that_went_back_keeps_its_highest_in_the_minimum() {
        let strategy = WatermarkStrategy::custom(|ts: &u64| *ts, || LastSeen(None));
        let mut marks = SourceWatermarks::new(strategy);
        let both = [1, 2];
        assert_eq!(marks.on_poll(&[50], 1, &both), SourceSignal::None);
        assert_eq!(marks.on_poll(&[40], 2, &both), SourceSignal::Watermark(39));
        assert_eq!(marks.on_poll(&[10], 1, &both), SourceSignal::None);
        assert_eq!(marks.regressions(), 1);
        assert_eq!(
            marks.on_poll(&[60], 2, &both),
            SourceSignal::Watermark(49),
            "split 1's 9 is ignored: its 49 stands"
        );
    }

    fn two_splits(idleness_ms: Option<u64>) -> (SourceWatermarks<u64>, ManualClock) {
        let clock = ManualClock::new(0);
        let mut strategy = WatermarkStrategy::monotonous(|ts: &u64| *ts).with_clock(clock.clone());
        if let Some(idleness_ms) = idleness_ms {
            strategy = strategy.with_idleness(idleness_ms);
        }
        (SourceWatermarks::new(strategy), clock)
    }

    #[test]
    fn the_watermark_is_the_minimum_over_the_splits() {
        let (mut marks, _) = two_splits(None);
        let both = [1, 2];
        assert_eq!(
            marks.on_poll(&[50], 1, &both),
            SourceSignal::None,
            "split 2 has no watermark yet and holds the subtask back"
        );
        assert_eq!(marks.on_poll(&[20], 2, &both), SourceSignal::Watermark(19));
        assert_eq!(marks.on_poll(&[60], 1, &both), SourceSignal::None);
        assert_eq!(marks.on_poll(&[40], 2, &both), SourceSignal::Watermark(39));
        assert_eq!(
            marks.on_poll(&[], 0, &[1]),
            SourceSignal::Watermark(59),
            "a split taken away holds nothing back"
        );
    }

    #[test]
    fn a_subtask_without_splits_is_idle_at_once_and_once() {
        let (mut marks, _) = two_splits(None);
        assert_eq!(marks.on_poll(&[], 0, &[]), SourceSignal::Idle);
        assert_eq!(marks.on_poll(&[], 0, &[]), SourceSignal::None);
        assert_eq!(
            marks.on_poll(&[7], 3, &[3]),
            SourceSignal::Watermark(6),
            "a split that arrives reads with a fresh generator"
        );
        assert_eq!(marks.on_poll(&[], 0, &[]), SourceSignal::Idle);
    }

    #[test]
    fn an_idle_split_stops_holding_back_and_holds_back_again_when_it_wakes() {
        let (mut marks, clock) = two_splits(Some(100));
        let both = [1, 2];
        assert_eq!(marks.on_poll(&[10], 1, &both), SourceSignal::None);
        assert_eq!(marks.on_poll(&[10], 2, &both), SourceSignal::Watermark(9));
        clock.advance_ms(60);
        assert_eq!(marks.on_poll(&[500], 1, &both), SourceSignal::None);
        clock.advance_ms(40);
        assert_eq!(
            marks.on_poll(&[600], 1, &both),
            SourceSignal::Watermark(599),
            "split 2 read nothing for 100 ms: only split 1 counts"
        );
        assert_eq!(marks.on_poll(&[300], 2, &both), SourceSignal::None);
        assert_eq!(
            marks.on_poll(&[900], 1, &both),
            SourceSignal::None,
            "split 2 woke up at 300 and holds the watermark at 599"
        );
        assert_eq!(
            marks.on_poll(&[800], 2, &both),
            SourceSignal::Watermark(799)
        );
        clock.advance_ms(100);
        assert_eq!(
            marks.on_poll(&[], 0, &both),
            SourceSignal::Idle,
            "both quiet: idle"
        );
        assert_eq!(marks.on_poll(&[], 0, &both), SourceSignal::None, "once");
    }
}
