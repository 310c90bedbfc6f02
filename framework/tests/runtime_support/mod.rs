//! Test pipeline built directly on the runtime layer: numbered sources, a
//! forwarding map, and a sink that streams what it sees back to the test
//! thread. Shared by the `runtime_*` integration tests.

#![allow(dead_code)] // Each test binary uses a different part of this module.

use std::sync::mpsc;
use std::time::Duration;

use snapflow::runtime::channel::{
    channel, ChannelConfig, ChannelId, ChannelReceiver, ChannelSender, ChannelStats, Outputs,
};
use snapflow::runtime::failure::{FailureReport, FailureSink};
use snapflow::runtime::pool::{ActorSlot, ArbiterPool, Placement};
use snapflow::runtime::source::{SourceActor, SourceConfig, SourceLogic, SourcePoll};
use snapflow::runtime::stage::{StageActor, StageConfig, StageIo, StageLogic};
use snapflow::runtime::{ActorTag, BoxError, Generation};

/// A hang guard for waits on the test thread, not a timing assertion.
pub const WAIT: Duration = Duration::from_secs(60);

/// The control items of the test graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ctl {
    /// An in-band marker carrying the number of records before it.
    Marker(u64),
    /// No more items on this channel.
    End,
}

/// A record: which source made it, and its sequence number there.
pub type Rec = (u32, u64);

/// What a channel carried, as the sink saw it, one entry per record or
/// control item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A record.
    Record(Rec),
    /// A control item.
    Control(Ctl),
}

/// One observation streamed from the sink to the test thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkEvent {
    /// A batch arrived on `input`.
    Batch { input: usize, records: Vec<Rec> },
    /// A control item arrived on `input`.
    Control { input: usize, control: Ctl },
}

/// Emits `(id, 0..total)`, a marker after every `marker_every` records (0:
/// never), then `End` if `end` is set. It emits `per_poll` records per poll.
pub struct NumberSource {
    pub id: u32,
    pub next: u64,
    pub total: u64,
    pub per_poll: u64,
    pub marker_every: u64,
    pub end: bool,
    /// Return Idle instead of Exhausted when done (so only linger flushes).
    pub idle_when_done: bool,
}

impl NumberSource {
    pub fn new(id: u32, total: u64) -> Self {
        Self {
            id,
            next: 0,
            total,
            per_poll: 256,
            marker_every: 0,
            end: true,
            idle_when_done: false,
        }
    }
}

impl SourceLogic for NumberSource {
    type Out = Rec;
    type Control = Ctl;

    fn poll(&mut self, outputs: &mut Outputs<Rec, Ctl>) -> Result<SourcePoll, BoxError> {
        let stop = (self.next + self.per_poll).min(self.total);
        while self.next < stop {
            outputs.emit(0, (self.id, self.next));
            self.next += 1;
            if self.marker_every > 0 && self.next % self.marker_every == 0 {
                outputs.emit_control(0, Ctl::Marker(self.next));
            }
        }
        if self.next < self.total {
            return Ok(SourcePoll::Ready);
        }
        if self.idle_when_done {
            return Ok(SourcePoll::Idle {
                retry_after_ms: 3_600_000,
            });
        }
        if self.end {
            outputs.broadcast_control(Ctl::End);
        }
        Ok(SourcePoll::Exhausted)
    }
}

/// Forwards records and control items from its one input to its one output;
/// fails at record `fail_at` (panics, or returns an error if `fail_with_error`).
pub struct ForwardMap {
    pub fail_at: Option<u64>,
    pub fail_with_error: bool,
    /// A marker emitted when the stage starts, before any input.
    pub start_marker: Option<u64>,
}

impl StageLogic for ForwardMap {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_started(&mut self, io: &mut StageIo<'_, Rec, Ctl>) -> Result<(), BoxError> {
        if let Some(marker) = self.start_marker {
            io.outputs().emit_control(0, Ctl::Marker(marker));
        }
        Ok(())
    }

    fn on_batch(
        &mut self,
        _input: usize,
        batch: Vec<Rec>,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        for record in batch {
            if Some(record.1) == self.fail_at {
                if self.fail_with_error {
                    return Err(format!("map rejected record {}", record.1).into());
                }
                panic!("map failed at record {}", record.1);
            }
            io.outputs().emit(0, record);
        }
        Ok(())
    }

    fn on_control(
        &mut self,
        _input: usize,
        control: Ctl,
        io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        io.outputs().emit_control(0, control);
        Ok(())
    }
}

/// Streams every batch and control item to the test thread; sleeps
/// `sleep_per_batch_ms` per batch to play a slow consumer.
pub struct StreamingSink {
    pub events: mpsc::Sender<SinkEvent>,
    pub sleep_per_batch_ms: u64,
}

impl StageLogic for StreamingSink {
    type In = Rec;
    type Out = Rec;
    type Control = Ctl;

    fn on_batch(
        &mut self,
        input: usize,
        batch: Vec<Rec>,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        if self.sleep_per_batch_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.sleep_per_batch_ms));
        }
        let _ = self.events.send(SinkEvent::Batch {
            input,
            records: batch,
        });
        Ok(())
    }

    fn on_control(
        &mut self,
        input: usize,
        control: Ctl,
        _io: &mut StageIo<'_, Rec, Ctl>,
    ) -> Result<(), BoxError> {
        let _ = self.events.send(SinkEvent::Control { input, control });
        Ok(())
    }
}

/// The shape of a test pipeline: `parallelism` sources, each feeding its own
/// map, every map feeding the one sink on its own channel.
pub struct PipelineSpec {
    pub parallelism: usize,
    pub records_per_source: u64,
    pub marker_every: u64,
    pub per_poll: u64,
    pub config: ChannelConfig,
    pub sink_sleep_per_batch_ms: u64,
    pub map_fail_at: Option<(usize, u64)>,
    pub map_fail_with_error: bool,
    pub generation: Generation,
    pub slice_items_max: usize,
    pub source_idle_when_done: bool,
    pub map_start_marker: Option<u64>,
}

impl Default for PipelineSpec {
    fn default() -> Self {
        Self {
            parallelism: 1,
            records_per_source: 1000,
            marker_every: 0,
            per_poll: 256,
            config: ChannelConfig::default(),
            sink_sleep_per_batch_ms: 0,
            map_fail_at: None,
            map_fail_with_error: false,
            generation: Generation(1),
            slice_items_max: 32,
            source_idle_when_done: false,
            map_start_marker: None,
        }
    }
}

/// A running pipeline's observation points.
pub struct Pipeline {
    pub events: mpsc::Receiver<SinkEvent>,
    pub failures: mpsc::Receiver<FailureReport>,
    /// Stats of the source -> map channels, by subtask.
    pub source_channels: Vec<ChannelStats>,
    /// Stats of the map -> sink channels, by subtask.
    pub sink_channels: Vec<ChannelStats>,
}

pub fn failure_channel() -> (FailureSink, mpsc::Receiver<FailureReport>) {
    let (sender, receiver) = mpsc::channel();
    let sink = FailureSink::from_fn(move |report| {
        let _ = sender.send(report);
    });
    (sink, receiver)
}

type SourceOut = ChannelSender<Rec, Ctl>;

/// Wires and starts the pipeline on `pool` (round-robin placement).
pub fn start_pipeline(pool: &ArbiterPool, spec: &PipelineSpec) -> Pipeline {
    let (failure_sink, failures) = failure_channel();
    let (event_sender, events) = mpsc::channel();
    let generation = spec.generation;
    let sink_slot = ActorSlot::<StageActor<StreamingSink>>::new();
    let mut sink_inputs: Vec<ChannelReceiver> = Vec::new();
    let mut source_channels = Vec::new();
    let mut sink_channels = Vec::new();
    for subtask in 0..spec.parallelism {
        let source_slot = ActorSlot::<SourceActor<NumberSource>>::new();
        let map_slot = ActorSlot::<StageActor<ForwardMap>>::new();
        let (to_map, map_input): (SourceOut, _) = channel(
            ChannelId(subtask as u64),
            generation,
            spec.config,
            map_slot.address().recipient(),
            source_slot.address().recipient(),
        );
        let (to_sink, sink_input) = channel(
            ChannelId(1000 + subtask as u64),
            generation,
            spec.config,
            sink_slot.address().recipient(),
            map_slot.address().recipient(),
        );
        source_channels.push(to_map.stats().clone());
        sink_channels.push(to_sink.stats().clone());
        sink_inputs.push(sink_input);
        let mut logic = NumberSource::new(subtask as u32, spec.records_per_source);
        logic.marker_every = spec.marker_every;
        logic.per_poll = spec.per_poll;
        logic.idle_when_done = spec.source_idle_when_done;
        start_source(
            pool,
            source_slot,
            ActorTag::new("source", subtask, generation),
            logic,
            to_map,
            &failure_sink,
        );
        let fail_at = spec
            .map_fail_at
            .and_then(|(failing, at)| (failing == subtask).then_some(at));
        let map = ForwardMap {
            fail_at,
            fail_with_error: spec.map_fail_with_error,
            start_marker: spec.map_start_marker,
        };
        let config = stage_config(spec.slice_items_max);
        let tag = ActorTag::new("map", subtask, generation);
        let sink = failure_sink.clone();
        pool.start_in_slot(
            map_slot,
            Placement::RoundRobin,
            tag.clone(),
            failure_sink.clone(),
            move |_| StageActor::new(tag, map, vec![map_input], vec![to_sink], config, sink),
        )
        .expect("start map");
    }
    let sink = StreamingSink {
        events: event_sender,
        sleep_per_batch_ms: spec.sink_sleep_per_batch_ms,
    };
    let tag = ActorTag::new("sink", 0, generation);
    let config = stage_config(spec.slice_items_max);
    let sink_failures = failure_sink.clone();
    pool.start_in_slot(
        sink_slot,
        Placement::RoundRobin,
        tag.clone(),
        failure_sink,
        move |_| StageActor::new(tag, sink, sink_inputs, Vec::new(), config, sink_failures),
    )
    .expect("start sink");
    Pipeline {
        events,
        failures,
        source_channels,
        sink_channels,
    }
}

pub fn start_source(
    pool: &ArbiterPool,
    slot: ActorSlot<SourceActor<NumberSource>>,
    tag: ActorTag,
    logic: NumberSource,
    output: SourceOut,
    failures: &FailureSink,
) {
    let actor_failures = failures.clone();
    let actor_tag = tag.clone();
    pool.start_in_slot(
        slot,
        Placement::RoundRobin,
        tag,
        failures.clone(),
        move |_| {
            SourceActor::new(
                actor_tag,
                logic,
                vec![output],
                SourceConfig::default(),
                actor_failures,
            )
        },
    )
    .expect("start source");
}

pub fn stage_config(slice_items_max: usize) -> StageConfig {
    StageConfig {
        slice_items_max: std::num::NonZeroUsize::new(slice_items_max).expect("slice size > 0"),
    }
}

/// Collects sink events per input until every input in `inputs` has seen
/// `Ctl::End`; returns what each input carried, in order.
pub fn collect_until_end(events: &mpsc::Receiver<SinkEvent>, inputs: usize) -> Vec<Vec<Seen>> {
    let mut seen = vec![Vec::new(); inputs];
    let mut ended = 0;
    while ended < inputs {
        match events
            .recv_timeout(WAIT)
            .expect("sink events stopped before End")
        {
            SinkEvent::Batch { input, records } => {
                seen[input].extend(records.into_iter().map(Seen::Record));
            }
            SinkEvent::Control { input, control } => {
                seen[input].push(Seen::Control(control));
                if control == Ctl::End {
                    ended += 1;
                }
            }
        }
    }
    seen
}

/// What source `id` emits: records with a marker after every `marker_every`,
/// then End.
pub fn expected_stream(id: u32, total: u64, marker_every: u64) -> Vec<Seen> {
    let mut expected = Vec::new();
    for sequence in 0..total {
        expected.push(Seen::Record((id, sequence)));
        if marker_every > 0 && (sequence + 1) % marker_every == 0 {
            expected.push(Seen::Control(Ctl::Marker(sequence + 1)));
        }
    }
    expected.push(Seen::Control(Ctl::End));
    expected
}
