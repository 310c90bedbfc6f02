//! Channels on the runtime layer: FIFO order with interleaved control items,
//! batch closing, credit windows, generation filtering, and fairness of a
//! busy actor towards timers on its arbiter.

mod runtime_support;

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use actix::{Actor, AsyncContext, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runtime_support::*;
use snapflow::runtime::channel::{channel, ChannelConfig, ChannelId, ChannelStats, Credit, Window};
use snapflow::runtime::pool::{ActorSlot, ArbiterPool, Placement, PoolConfig};
use snapflow::runtime::source::SourceActor;
use snapflow::runtime::stage::{StageActor, StageIo, StageLogic};
use snapflow::runtime::{ActorTag, BoxError, Generation};

fn pool(arbiters: usize) -> ArbiterPool {
    let arbiters = NonZeroUsize::new(arbiters).expect("arbiters > 0");
    ArbiterPool::new(PoolConfig { arbiters }).expect("start pool")
}

fn config(batch_size_max: usize, batch_linger_ms: u64, window: Option<usize>) -> ChannelConfig {
    ChannelConfig {
        batch_size_max: NonZeroUsize::new(batch_size_max).expect("batch size > 0"),
        batch_linger_ms,
        window: match window {
            Some(max) => Window::Bounded(NonZeroUsize::new(max).expect("window > 0")),
            None => Window::Unbounded,
        },
    }
}

fn seed() -> u64 {
    match std::env::var("SNAPFLOW_SEED") {
        Ok(text) => text.parse().expect("SNAPFLOW_SEED must be a u64"),
        Err(_) => rand::random(),
    }
}

fn assert_same_stream(actual: &[Seen], expected: &[Seen], context: &str) {
    let mismatch = actual.iter().zip(expected).position(|(a, e)| a != e);
    if let Some(index) = mismatch {
        panic!(
            "{context}: item {index} is {:?}, expected {:?}",
            actual[index], expected[index]
        );
    }
    assert_eq!(actual.len(), expected.len(), "{context}: stream length");
}

/// Random channel tuning and marker spacing from `seed`, then every
/// channel's stream must arrive exactly as its source emitted it.
fn check_fifo(parallelism: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let window = rng.gen_range(1..=8);
    let spec = PipelineSpec {
        parallelism,
        records_per_source: rng.gen_range(2_000..20_000),
        marker_every: rng.gen_range(1..700),
        per_poll: rng.gen_range(1..500),
        config: config(rng.gen_range(1..300), rng.gen_range(0..3), Some(window)),
        slice_items_max: rng.gen_range(1..40),
        ..PipelineSpec::default()
    };
    let context = format!("parallelism {parallelism}, replay with SNAPFLOW_SEED={seed}");
    let pool = pool(2);
    let pipeline = start_pipeline(&pool, &spec);
    let seen = collect_until_end(&pipeline.events, parallelism);
    for (input, stream) in seen.iter().enumerate() {
        let expected = expected_stream(input as u32, spec.records_per_source, spec.marker_every);
        assert_same_stream(stream, &expected, &format!("{context}, input {input}"));
    }
    for stats in pipeline
        .source_channels
        .iter()
        .chain(&pipeline.sink_channels)
    {
        assert!(
            stats.in_flight_batches_peak() <= window as u64,
            "{context}: window exceeded"
        );
    }
    assert!(
        pipeline.failures.try_recv().is_err(),
        "{context}: unexpected failure"
    );
    pool.shutdown().expect("shutdown");
}

#[test]
fn fifo_with_control_items_parallelism_1() {
    check_fifo(1, seed());
}

#[test]
fn fifo_with_control_items_parallelism_2() {
    check_fifo(2, seed());
}

#[test]
fn fifo_with_control_items_parallelism_3() {
    check_fifo(3, seed());
}

#[test]
fn what_a_stage_emits_when_it_starts_precedes_its_input() {
    let spec = PipelineSpec {
        map_start_marker: Some(999),
        ..PipelineSpec::default()
    };
    let pool = pool(2);
    let pipeline = start_pipeline(&pool, &spec);
    let seen = collect_until_end(&pipeline.events, 1);
    let mut expected = vec![Seen::Control(Ctl::Marker(999))];
    expected.extend(expected_stream(0, spec.records_per_source, 0));
    assert_same_stream(&seen[0], &expected, "start marker");
    pool.shutdown().expect("shutdown");
}

/// Receives batch sizes at the sink until `records` records have arrived.
fn batch_sizes(events: &mpsc::Receiver<SinkEvent>, records: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    while sizes.iter().sum::<usize>() < records {
        if let SinkEvent::Batch { records, .. } = events.recv_timeout(WAIT).expect("sink events") {
            sizes.push(records.len());
        }
    }
    sizes
}

/// The source emits `records` and then idles, so only the size limit and
/// the linger timer can close batches (nothing flushes at end of input).
fn check_batch_sizes(batch_size_max: usize, records: u64, expected: Vec<usize>) {
    let spec = PipelineSpec {
        records_per_source: records,
        per_poll: records,
        config: config(batch_size_max, 20, Some(8)),
        source_idle_when_done: true,
        ..PipelineSpec::default()
    };
    let pool = pool(2);
    let pipeline = start_pipeline(&pool, &spec);
    assert_eq!(batch_sizes(&pipeline.events, records as usize), expected);
    pool.shutdown().expect("shutdown");
}

#[test]
fn batches_close_at_size_and_the_rest_at_linger() {
    let mut expected = vec![100; 10];
    expected.push(50);
    check_batch_sizes(100, 1050, expected);
}

#[test]
fn a_batch_that_never_fills_closes_at_linger() {
    check_batch_sizes(1_000_000, 10, vec![10]);
}

#[test]
fn slow_sink_keeps_batches_in_flight_within_window() {
    let window = 4;
    let spec = PipelineSpec {
        records_per_source: 64 * 200,
        per_poll: 64,
        config: config(64, 5, Some(window)),
        sink_sleep_per_batch_ms: 2,
        ..PipelineSpec::default()
    };
    let pool = pool(2);
    let pipeline = start_pipeline(&pool, &spec);
    let seen = collect_until_end(&pipeline.events, 1);
    assert_same_stream(
        &seen[0],
        &expected_stream(0, spec.records_per_source, 0),
        "slow sink",
    );
    let to_map = &pipeline.source_channels[0];
    let to_sink = &pipeline.sink_channels[0];
    assert_eq!(
        to_sink.in_flight_batches_peak(),
        window as u64,
        "window to the sink was not used up"
    );
    assert!(to_map.in_flight_batches_peak() <= window as u64);
    assert!(to_sink.credit_stalls() > 0, "map never waited for the sink");
    assert!(
        to_map.credit_stalls() > 0,
        "the stall did not propagate to the source"
    );
    assert_eq!(to_map.batches_sent(), 200);
    pool.shutdown().expect("shutdown");
}

fn wait_until(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn messages_of_an_old_generation_are_dropped() {
    let pool = pool(2);
    let (failures, _failure_reports) = failure_channel();
    let (event_sender, events) = mpsc::channel();
    let channel_id = ChannelId(7);
    let tuning = config(4, 5, Some(8));
    let sink_slot = ActorSlot::<StageActor<StreamingSink>>::new();
    let old_slot = ActorSlot::<SourceActor<NumberSource>>::new();
    let new_slot = ActorSlot::<SourceActor<NumberSource>>::new();
    // The same channel id in generation 1 (stale) and generation 2.
    let (old_sender, _old_receiver) = channel(
        channel_id,
        Generation(1),
        tuning,
        sink_slot.address().recipient(),
        old_slot.address().recipient(),
    );
    let (new_sender, new_receiver) = channel(
        channel_id,
        Generation(2),
        tuning,
        sink_slot.address().recipient(),
        new_slot.address().recipient(),
    );
    let old_stats = old_sender.stats().clone();
    let new_stats: ChannelStats = new_sender.stats().clone();
    // The old source sends everything (3 batches and End fit in its window)
    // into the sink's mailbox before the new generation starts, so the sink
    // sees the stale items first.
    let old_tag = ActorTag::new("source", 0, Generation(1));
    start_source(
        &pool,
        old_slot,
        old_tag,
        NumberSource::new(9, 10),
        old_sender,
        &failures,
    );
    wait_until("the old source sent End", || old_stats.controls_sent() == 1);
    new_slot.address().do_send(Credit {
        channel: channel_id,
        generation: Generation(1),
        batches: 1,
    });
    let sink = StreamingSink {
        events: event_sender,
        sleep_per_batch_ms: 0,
    };
    let sink_tag = ActorTag::new("sink", 0, Generation(2));
    let sink_failures = failures.clone();
    pool.start_in_slot(
        sink_slot,
        Placement::RoundRobin,
        sink_tag.clone(),
        failures.clone(),
        move |_| {
            StageActor::new(
                sink_tag,
                sink,
                vec![new_receiver],
                Vec::new(),
                stage_config(8),
                sink_failures,
            )
        },
    )
    .expect("start sink");
    let new_tag = ActorTag::new("source", 0, Generation(2));
    start_source(
        &pool,
        new_slot,
        new_tag,
        NumberSource::new(0, 100),
        new_sender,
        &failures,
    );
    let seen = collect_until_end(&events, 1);
    assert_same_stream(&seen[0], &expected_stream(0, 100, 0), "new generation");
    let stale_items = old_stats.batches_sent() + old_stats.controls_sent();
    assert_eq!(stale_items, 4);
    // Four stale deliveries at the sink, one stale credit at the new source.
    assert_eq!(new_stats.stale_dropped(), stale_items + 1);
    pool.shutdown().expect("shutdown");
}

/// Counts the ticks of a 10 ms interval timer.
struct Ticker {
    ticks: Arc<AtomicUsize>,
}

impl Actor for Ticker {
    type Context = Context<Self>;

    fn started(&mut self, context: &mut Context<Self>) {
        context.run_interval(Duration::from_millis(10), |ticker, _| {
            ticker.ticks.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// Works 1 ms per batch and reports the tick count at its first and last
/// batch.
struct BusyWorker {
    ticks: Arc<AtomicUsize>,
    batches_total: usize,
    processed: usize,
    ticks_at_first: usize,
    marks: mpsc::Sender<(usize, usize)>,
}

impl StageLogic for BusyWorker {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_batch(
        &mut self,
        _input: usize,
        _batch: Vec<Rec>,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        if self.processed == 0 {
            self.ticks_at_first = self.ticks.load(Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(1));
        self.processed += 1;
        if self.processed == self.batches_total {
            let _ = self
                .marks
                .send((self.ticks_at_first, self.ticks.load(Ordering::Relaxed)));
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        _input: usize,
        _control: Ctl,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Queues a backlog of `batches` in a busy worker's mailbox before it starts
/// on arbiter 0, next to a 10 ms ticker; returns the ticks counted while the
/// worker worked through the backlog.
fn ticks_during_backlog(slice_items_max: usize, batches: usize) -> usize {
    let pool = pool(2);
    let (failures, _reports) = failure_channel();
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker_ticks = Arc::clone(&ticks);
    let ticker_tag = ActorTag::new("ticker", 0, Generation(1));
    pool.start(
        Placement::Arbiter(0),
        ticker_tag,
        failures.clone(),
        move |_| Ticker {
            ticks: ticker_ticks,
        },
    )
    .expect("start ticker");
    let worker_slot = ActorSlot::<StageActor<BusyWorker>>::new();
    let source_slot = ActorSlot::<SourceActor<NumberSource>>::new();
    let (to_worker, worker_input) = channel(
        ChannelId(0),
        Generation(1),
        config(64, 5, None),
        worker_slot.address().recipient(),
        source_slot.address().recipient(),
    );
    let source_stats = to_worker.stats().clone();
    let mut source = NumberSource::new(0, 64 * batches as u64);
    source.per_poll = 64;
    let source_tag = ActorTag::new("source", 0, Generation(1));
    // Round-robin placement puts the source on arbiter 1 (the ticker used
    // an explicit index, which does not advance the round-robin counter).
    pool.resolve(Placement::RoundRobin).expect("skip arbiter 0");
    start_source(&pool, source_slot, source_tag, source, to_worker, &failures);
    wait_until("the backlog is queued", || {
        source_stats.controls_sent() == 1
    });
    wait_until("the ticker ticked", || ticks.load(Ordering::Relaxed) > 0);
    let (marks_sender, marks) = mpsc::channel();
    let worker = BusyWorker {
        ticks: Arc::clone(&ticks),
        batches_total: batches,
        processed: 0,
        ticks_at_first: 0,
        marks: marks_sender,
    };
    let worker_tag = ActorTag::new("worker", 0, Generation(1));
    let worker_failures = failures.clone();
    pool.start_in_slot(
        worker_slot,
        Placement::Arbiter(0),
        worker_tag.clone(),
        failures,
        move |_| {
            StageActor::new(
                worker_tag,
                worker,
                vec![worker_input],
                Vec::new(),
                stage_config(slice_items_max),
                worker_failures,
            )
        },
    )
    .expect("start worker");
    let (first, last) = marks.recv_timeout(WAIT).expect("worker finished");
    pool.shutdown().expect("shutdown");
    eprintln!(
        "slice {slice_items_max}: {} ticks during the backlog",
        last - first
    );
    last - first
}

#[test]
fn a_busy_stage_yields_so_timers_on_its_arbiter_keep_firing() {
    // 300 batches of 1 ms work, yielding every 4 batches: about 30 ticks are
    // due; 5 is a generous floor for a loaded machine.
    let ticks = ticks_during_backlog(4, 300);
    assert!(
        ticks >= 5,
        "the 10 ms timer fired only {ticks} times in a 300 ms backlog"
    );
}

#[test]
fn a_stage_that_never_yields_starves_timers_on_its_arbiter() {
    // The control case: the same backlog in one slice freezes the timer, so
    // the test above measures the yielding, not the machine.
    assert_eq!(ticks_during_backlog(1_000_000, 100), 0);
}

/// Loop entry: turns source record `(_, n)` into `(n, n % 4)` (an id and the
/// hops it still has to make round the loop) and forwards back-edge records
/// unchanged. Drops control items: this test counts records only.
struct LoopHead;

impl StageLogic for LoopHead {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_batch(
        &mut self,
        input: usize,
        batch: Vec<Rec>,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        for (first, second) in batch {
            let record = if input == 0 {
                (second as u32, second % 4)
            } else {
                (first, second)
            };
            io.outputs().emit(0, record);
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        _input: usize,
        _control: Ctl,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Loop body: sends a record with hops left round the back edge (output 0)
/// with one hop fewer, and a finished record to the sink (output 1).
struct LoopTail;

impl StageLogic for LoopTail {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_batch(
        &mut self,
        _input: usize,
        batch: Vec<Rec>,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        for (id, hops) in batch {
            match hops {
                0 => io.outputs().emit(1, (id, 0)),
                _ => io.outputs().emit(0, (id, hops - 1)),
            }
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        _input: usize,
        _control: Ctl,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        Ok(())
    }
}

#[test]
fn a_cycle_with_an_unbounded_back_edge_completes_under_tight_windows() {
    // Forward windows of one batch: with a bounded back edge the head would
    // wait for credit from the tail while the tail waits for the head.
    let records = 5_000;
    let forward = config(16, 1, Some(1));
    let back = forward.unbounded();
    let pool = pool(2);
    let (failures, failure_reports) = failure_channel();
    let (event_sender, events) = mpsc::channel();
    let generation = Generation(1);
    let source_slot = ActorSlot::<SourceActor<NumberSource>>::new();
    let head_slot = ActorSlot::<StageActor<LoopHead>>::new();
    let tail_slot = ActorSlot::<StageActor<LoopTail>>::new();
    let sink_slot = ActorSlot::<StageActor<StreamingSink>>::new();
    let (to_head, head_from_source) = channel(
        ChannelId(0),
        generation,
        forward,
        head_slot.address().recipient(),
        source_slot.address().recipient(),
    );
    let (head_to_tail, tail_input) = channel(
        ChannelId(1),
        generation,
        forward,
        tail_slot.address().recipient(),
        head_slot.address().recipient(),
    );
    let (back_edge, head_from_back_edge) = channel(
        ChannelId(2),
        generation,
        back,
        head_slot.address().recipient(),
        tail_slot.address().recipient(),
    );
    let (tail_to_sink, sink_input) = channel(
        ChannelId(3),
        generation,
        forward,
        sink_slot.address().recipient(),
        tail_slot.address().recipient(),
    );
    let back_edge_stats = back_edge.stats().clone();
    let stage = |name: &str| (ActorTag::new(name, 0, generation), failures.clone());
    let (tag, sink_failures) = stage("sink");
    let sink = StreamingSink {
        events: event_sender,
        sleep_per_batch_ms: 0,
    };
    pool.start_in_slot(
        sink_slot,
        Placement::RoundRobin,
        tag.clone(),
        failures.clone(),
        move |_| {
            StageActor::new(
                tag,
                sink,
                vec![sink_input],
                Vec::new(),
                stage_config(8),
                sink_failures,
            )
        },
    )
    .expect("start sink");
    let (tag, tail_failures) = stage("tail");
    pool.start_in_slot(
        tail_slot,
        Placement::RoundRobin,
        tag.clone(),
        failures.clone(),
        move |_| {
            StageActor::new(
                tag,
                LoopTail,
                vec![tail_input],
                vec![back_edge, tail_to_sink],
                stage_config(8),
                tail_failures,
            )
        },
    )
    .expect("start tail");
    let (tag, head_failures) = stage("head");
    pool.start_in_slot(
        head_slot,
        Placement::RoundRobin,
        tag.clone(),
        failures.clone(),
        move |_| {
            let inputs = vec![head_from_source, head_from_back_edge];
            StageActor::new(
                tag,
                LoopHead,
                inputs,
                vec![head_to_tail],
                stage_config(8),
                head_failures,
            )
        },
    )
    .expect("start head");
    let mut source = NumberSource::new(0, records);
    source.per_poll = 64;
    start_source(
        &pool,
        source_slot,
        ActorTag::new("source", 0, generation),
        source,
        to_head,
        &failures,
    );
    let mut arrived = vec![0_u32; records as usize];
    let mut count = 0;
    while count < records {
        if let SinkEvent::Batch { records: batch, .. } =
            events.recv_timeout(WAIT).expect("loop output")
        {
            for (id, hops) in batch {
                assert_eq!(hops, 0);
                arrived[id as usize] += 1;
                count += 1;
            }
        }
    }
    assert!(
        arrived.iter().all(|&times| times == 1),
        "a record was lost or duplicated"
    );
    // Ids with n % 4 = h go round h times: 0+1+2+3 per 4 ids.
    assert_eq!(back_edge_stats.records_sent(), records / 4 * 6);
    assert!(failure_reports.try_recv().is_err());
    pool.shutdown().expect("shutdown");
}

/// Merges two inputs onto one output. Holds input 0 from its `Marker(100)`
/// until input 1 ends, as barrier alignment holds a channel.
struct HoldingMerge;

impl StageLogic for HoldingMerge {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_batch(
        &mut self,
        _input: usize,
        batch: Vec<Rec>,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        batch
            .into_iter()
            .for_each(|record| io.outputs().emit(0, record));
        Ok(())
    }

    fn on_control(
        &mut self,
        input: usize,
        control: Ctl,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        io.outputs().emit_control(0, control);
        match (input, control) {
            (0, Ctl::Marker(100)) => io.hold_input(0),
            (1, Ctl::End) => io.release_input(0),
            _ => {}
        }
        Ok(())
    }
}

/// Appends what the sink's one input carries to `seen`, up to and including
/// the item `until`.
fn collect_into(events: &mpsc::Receiver<SinkEvent>, seen: &mut Vec<Seen>, until: Seen) {
    loop {
        match events.recv_timeout(WAIT).expect("sink events") {
            SinkEvent::Batch { records, .. } => seen.extend(records.into_iter().map(Seen::Record)),
            SinkEvent::Control { control, .. } => {
                seen.push(Seen::Control(control));
                if Seen::Control(control) == until {
                    return;
                }
            }
        }
    }
}

#[test]
fn a_held_input_is_not_processed_until_released() {
    let pool = pool(2);
    let (failures, failure_reports) = failure_channel();
    let (event_sender, events) = mpsc::channel();
    let generation = Generation(1);
    let tuning = config(32, 1, Some(2));
    let merge_slot = ActorSlot::<StageActor<HoldingMerge>>::new();
    let sink_slot = ActorSlot::<StageActor<StreamingSink>>::new();
    let (to_sink, sink_input) = channel(
        ChannelId(10),
        generation,
        tuning,
        sink_slot.address().recipient(),
        merge_slot.address().recipient(),
    );
    let mut merge_inputs = Vec::new();
    let mut sources = Vec::new();
    for id in 0..2_u32 {
        let slot = ActorSlot::<SourceActor<NumberSource>>::new();
        let (sender, receiver) = channel(
            ChannelId(u64::from(id)),
            generation,
            tuning,
            merge_slot.address().recipient(),
            slot.address().recipient(),
        );
        merge_inputs.push(receiver);
        let mut source = NumberSource::new(id, 1_000);
        source.marker_every = if id == 0 { 100 } else { 0 };
        let tag = ActorTag::new("source", id as usize, generation);
        sources.push((slot, tag, source, sender));
    }
    // Source 1 starts only once input 0 is held, so the hold is not a race.
    let (slot, tag, source, sender) = sources.remove(0);
    start_source(&pool, slot, tag, source, sender, &failures);
    let sink = StreamingSink {
        events: event_sender,
        sleep_per_batch_ms: 0,
    };
    let (tag, sink_failures) = (ActorTag::new("sink", 0, generation), failures.clone());
    pool.start_in_slot(
        sink_slot,
        Placement::RoundRobin,
        tag.clone(),
        failures.clone(),
        move |_| {
            StageActor::new(
                tag,
                sink,
                vec![sink_input],
                Vec::new(),
                stage_config(8),
                sink_failures,
            )
        },
    )
    .expect("start sink");
    let (tag, merge_failures) = (ActorTag::new("merge", 0, generation), failures.clone());
    pool.start_in_slot(
        merge_slot,
        Placement::RoundRobin,
        tag.clone(),
        failures.clone(),
        move |_| {
            StageActor::new(
                tag,
                HoldingMerge,
                merge_inputs,
                vec![to_sink],
                stage_config(8),
                merge_failures,
            )
        },
    )
    .expect("start merge");
    let mut merged = Vec::new();
    collect_into(&events, &mut merged, Seen::Control(Ctl::Marker(100)));
    let (slot, tag, source, sender) = sources.remove(0);
    start_source(&pool, slot, tag, source, sender, &failures);
    collect_into(&events, &mut merged, Seen::Control(Ctl::End));
    let first_end = merged.len() - 1;
    collect_into(&events, &mut merged, Seen::Control(Ctl::End));
    let marker = merged
        .iter()
        .position(|seen| *seen == Seen::Control(Ctl::Marker(100)));
    let marker = marker.expect("the marker arrived");
    let held_records = merged[marker..]
        .iter()
        .filter(|seen| matches!(seen, Seen::Record((0, _))));
    let other_records = merged
        .iter()
        .filter(|seen| matches!(seen, Seen::Record((1, _))));
    // Input 1 ended first (input 0 was held until then), and nothing of
    // input 0 after its marker overtook input 1's end.
    assert_eq!(other_records.count(), 1_000);
    assert!(!merged[first_end..]
        .iter()
        .any(|seen| matches!(seen, Seen::Record((1, _)))));
    let first_held = merged[marker + 1..]
        .iter()
        .position(|seen| matches!(seen, Seen::Record((0, _))))
        .map(|offset| marker + 1 + offset);
    assert!(first_held.expect("input 0 resumed") > first_end);
    assert_eq!(held_records.count(), 900);
    let input_zero: Vec<Seen> = merged
        .iter()
        .copied()
        .filter(|seen| matches!(seen, Seen::Record((0, _)) | Seen::Control(Ctl::Marker(_))))
        .collect();
    let expected: Vec<Seen> = expected_stream(0, 1_000, 100)
        .into_iter()
        .filter(|seen| *seen != Seen::Control(Ctl::End))
        .collect();
    assert_same_stream(&input_zero, &expected, "held input");
    assert!(failure_reports.try_recv().is_err());
    pool.shutdown().expect("shutdown");
}
