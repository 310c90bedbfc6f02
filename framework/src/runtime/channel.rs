//! Typed FIFO channels between actor instances: batching, linger, credits
//! and generation filtering.
//!
//! A channel has exactly one sending actor, which owns the
//! [`ChannelSender`], and one receiving actor, which owns the
//! [`ChannelReceiver`]. Records are grouped into batches (a batch closes at
//! `batch_size_max` records or `batch_linger_ms` after its first record);
//! control items of the caller's type `C` (barriers, end of input, later
//! watermarks) travel in the same stream and first close the open batch, so
//! the receiver sees records and control items exactly in the order they were
//! pushed.
//!
//! Order: every item goes out with `do_send` on one `Recipient`, from one
//! actor. actix mailboxes are FIFO per sender, and this module never uses
//! `send()` or `try_send()`, because mixing them with `do_send` on a parked
//! address can reorder messages.
//!
//! Backpressure: `do_send` ignores mailbox capacity, so the bound is built
//! here. A bounded channel lets at most `in_flight_batches_max` batches be
//! sent but not yet processed; the receiver returns a [`Credit`] after it has
//! processed a batch. Sealed items that may not go out yet wait in the
//! sender's pending queue, and [`ChannelSender::has_credit`] turns false, which
//! tells the owning actor to stop pulling from its own upstream (a source
//! stops polling; an operator stops taking input, so its input channels stop
//! returning credits and the stall propagates upstream). Control items need no
//! credit but never overtake a batch.
//!
//! This module never owns an actor, never blocks a thread and never arms a
//! timer: the owning actor asks for [`ChannelSender::linger_deadline`] and
//! calls [`ChannelSender::flush_lingered`] when it passes.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::mem;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Message, Recipient};

use super::Generation;

/// One item on a channel: a batch of records or one control item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<T, C> {
    /// Records, in the order they were pushed. Never empty.
    Batch(Vec<T>),
    /// An in-band control item (its meaning is the caller's).
    Control(C),
}

/// The identity of one channel within a generation, assigned by whoever
/// wires the graph. The receiving actor routes deliveries by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ChannelId(pub u64);

/// How many batches may be in flight on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// At most this many batches sent and not yet processed.
    Bounded(NonZeroUsize),
    /// No bound. Back edges of cycles must use this (or a spilling queue,
    /// which does not exist yet): with a bounded back edge, a node waiting for
    /// credit on its back edge stops taking input, so the node at the other
    /// end of the loop stops too and never returns the credit; the loop
    /// deadlocks. The memory on an unbounded back edge is bounded only by how
    /// much the loop amplifies its input; the stats show it.
    Unbounded,
}

/// The tuning of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// A batch closes when it holds this many records.
    pub batch_size_max: NonZeroUsize,
    /// A batch closes this long after its first record was pushed, even if
    /// it is not full (0: at the owning actor's next timer turn).
    pub batch_linger_ms: u64,
    /// The bound on batches in flight.
    pub window: Window,
}

impl Default for ChannelConfig {
    /// 1024 records per batch, 5 ms linger, 8 batches in flight.
    fn default() -> Self {
        Self {
            batch_size_max: NonZeroUsize::new(1024).unwrap_or(NonZeroUsize::MIN),
            batch_linger_ms: 5,
            window: Window::Bounded(NonZeroUsize::new(8).unwrap_or(NonZeroUsize::MIN)),
        }
    }
}

impl ChannelConfig {
    /// The same configuration with an unbounded window (for back edges).
    pub fn unbounded(self) -> Self {
        Self {
            window: Window::Unbounded,
            ..self
        }
    }
}

/// The actor message that carries one item to the receiving actor.
#[derive(Debug)]
pub struct Delivery<T, C> {
    /// The channel it travels on.
    pub channel: ChannelId,
    /// The sender's generation; a receiver of another generation drops it.
    pub generation: Generation,
    /// The payload.
    pub item: Item<T, C>,
}

impl<T: 'static, C: 'static> Message for Delivery<T, C> {
    type Result = ();
}

/// The actor message a receiver sends back to the sending actor after it has
/// processed batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credit {
    /// The channel the credit is for.
    pub channel: ChannelId,
    /// The receiver's generation; a sender of another generation ignores it.
    pub generation: Generation,
    /// How many batches were processed.
    pub batches: u32,
}

impl Message for Credit {
    type Result = ();
}

#[derive(Debug, Default)]
struct StatsInner {
    batches_sent: AtomicU64,
    records_sent: AtomicU64,
    controls_sent: AtomicU64,
    credits_received: AtomicU64,
    in_flight_batches: AtomicU64,
    in_flight_batches_peak: AtomicU64,
    credit_stalls: AtomicU64,
    stale_dropped: AtomicU64,
}

/// Counters of one channel, readable from any thread while the job runs.
/// Both halves of the channel update them; cloning shares them.
#[derive(Debug, Clone, Default)]
pub struct ChannelStats {
    inner: Arc<StatsInner>,
}

impl ChannelStats {
    /// Batches sent so far.
    pub fn batches_sent(&self) -> u64 {
        self.inner.batches_sent.load(Ordering::Acquire)
    }
    /// Records sent so far.
    pub fn records_sent(&self) -> u64 {
        self.inner.records_sent.load(Ordering::Acquire)
    }
    /// Control items sent so far.
    pub fn controls_sent(&self) -> u64 {
        self.inner.controls_sent.load(Ordering::Acquire)
    }
    /// Batch credits the sender has received back.
    pub fn credits_received(&self) -> u64 {
        self.inner.credits_received.load(Ordering::Acquire)
    }
    /// Batches sent and not yet credited back, now.
    pub fn in_flight_batches(&self) -> u64 {
        self.inner.in_flight_batches.load(Ordering::Acquire)
    }
    /// The largest value [`ChannelStats::in_flight_batches`] has had.
    pub fn in_flight_batches_peak(&self) -> u64 {
        self.inner.in_flight_batches_peak.load(Ordering::Acquire)
    }
    /// How many times the sender ran out of credit (a batch took the last
    /// credit of the window). Always 0 on unbounded channels.
    pub fn credit_stalls(&self) -> u64 {
        self.inner.credit_stalls.load(Ordering::Acquire)
    }
    /// Deliveries and credits dropped because they carried another
    /// generation or another channel's id.
    pub fn stale_dropped(&self) -> u64 {
        self.inner.stale_dropped.load(Ordering::Acquire)
    }

    /// Release pairs with the getters' Acquire: a thread that reads a count
    /// also sees what the sender did before counting (the item is in the
    /// receiver's mailbox).
    fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Release);
    }
}

impl crate::metrics::QueueProbe for ChannelStats {
    fn in_flight_batches(&self) -> u64 {
        ChannelStats::in_flight_batches(self)
    }
    fn records_sent(&self) -> u64 {
        ChannelStats::records_sent(self)
    }
}

/// Makes the two halves of a channel.
///
/// `receiver` is the receiving actor's recipient for deliveries and
/// `credit_target` the sending actor's recipient for credits (both usually
/// from an [`super::pool::ActorSlot`], so a channel can be made before either
/// actor runs).
pub fn channel<T, C>(
    id: ChannelId,
    generation: Generation,
    config: ChannelConfig,
    receiver: Recipient<Delivery<T, C>>,
    credit_target: Recipient<Credit>,
) -> (ChannelSender<T, C>, ChannelReceiver)
where
    T: Send + 'static,
    C: Send + 'static,
{
    let stats = ChannelStats::default();
    let sender = ChannelSender {
        id,
        generation,
        config,
        target: receiver,
        open: Vec::new(),
        open_since: None,
        pending: VecDeque::new(),
        in_flight_batches: 0,
        stats: stats.clone(),
    };
    let receiver = ChannelReceiver {
        id,
        generation,
        credit_target,
        stats,
    };
    (sender, receiver)
}

/// The sending half of a channel, owned by the one actor that sends on it.
pub struct ChannelSender<T, C>
where
    T: Send + 'static,
    C: Send + 'static,
{
    id: ChannelId,
    generation: Generation,
    config: ChannelConfig,
    target: Recipient<Delivery<T, C>>,
    open: Vec<T>,
    open_since: Option<Instant>,
    /// Sealed items waiting for credit, in order. Its bound: the owning actor
    /// stops producing when `has_credit` is false, so it grows only by what
    /// one callback emits after the window filled (about one batch for a
    /// source poll or a map of one batch; a flat-map that multiplies its
    /// input can add more, which is the price of never blocking the thread).
    pending: VecDeque<Item<T, C>>,
    in_flight_batches: usize,
    stats: ChannelStats,
}

impl<T: Send + 'static, C: Send + 'static> ChannelSender<T, C> {
    /// The channel's id.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// The channel's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The channel's configuration.
    pub fn config(&self) -> &ChannelConfig {
        &self.config
    }

    /// The channel's counters.
    pub fn stats(&self) -> &ChannelStats {
        &self.stats
    }

    /// Every record pushed into the channel so far: sent, sealed and
    /// waiting for credit, or in the open batch. Computed when asked (a
    /// snapshot's check reads it once per marker), so pushing pays nothing.
    pub fn records_accepted(&self) -> u64 {
        let pending: usize = self
            .pending
            .iter()
            .map(|item| match item {
                Item::Batch(batch) => batch.len(),
                Item::Control(_) => 0,
            })
            .sum();
        self.stats.records_sent() + (pending + self.open.len()) as u64
    }

    /// Appends a record to the open batch, sealing the batch when it is
    /// full. Returns true when this record opened a new batch (the owning
    /// actor then makes sure a linger timer is armed).
    #[inline]
    pub fn push(&mut self, record: T) -> bool {
        let opened = self.open.is_empty();
        if opened {
            self.open_since = Some(Instant::now());
            if self.open.capacity() == 0 {
                // Preallocate, but not a huge batch_size_max at once.
                self.open
                    .reserve(self.config.batch_size_max.get().min(4096));
            }
        }
        self.open.push(record);
        if self.open.len() >= self.config.batch_size_max.get() {
            self.seal();
        }
        opened
    }

    /// Appends every record of `records` in order, leaving it empty (its
    /// capacity is kept), as [`ChannelSender::push`] would one by one but
    /// with one size check per batch instead of per record. Returns true
    /// when this opened a new batch.
    pub fn push_all(&mut self, records: &mut Vec<T>) -> bool {
        let opened = self.open.is_empty() && !records.is_empty();
        let batch_size_max = self.config.batch_size_max.get();
        if opened && records.len() <= batch_size_max {
            // The caller's vector becomes the open batch without a copy, and
            // the caller gets the empty one back (callers that refill it
            // reserve capacity again; see `Collector`).
            self.open_since = Some(Instant::now());
            mem::swap(&mut self.open, records);
            if self.open.len() >= batch_size_max {
                self.seal();
            }
            return true;
        }
        if records.len() <= batch_size_max.saturating_sub(self.open.len()) {
            // It fits: one move of the whole slice.
            self.open.append(records);
            if self.open.len() >= batch_size_max {
                self.seal();
            }
            return opened;
        }
        let mut rest = records.drain(..);
        while !rest.as_slice().is_empty() {
            if self.open.is_empty() {
                self.open_since = Some(Instant::now());
                if self.open.capacity() == 0 {
                    self.open.reserve(batch_size_max.min(4096));
                }
            }
            let room = batch_size_max.saturating_sub(self.open.len());
            self.open.extend(rest.by_ref().take(room));
            if self.open.len() >= batch_size_max {
                self.seal();
            }
        }
        opened
    }

    /// Closes the open batch, then queues the control item behind it.
    pub fn push_control(&mut self, control: C) {
        self.seal();
        self.enqueue(Item::Control(control));
    }

    /// Closes the open batch (if any) now.
    pub fn flush(&mut self) {
        self.seal();
    }

    /// When the open batch must close, if there is one. A linger time too
    /// large to add to the clock means the batch closes only when full.
    pub fn linger_deadline(&self) -> Option<Instant> {
        self.open_since
            .and_then(|since| since.checked_add(Duration::from_millis(self.config.batch_linger_ms)))
    }

    /// Closes the open batch if its linger time has passed at `now`.
    pub fn flush_lingered(&mut self, now: Instant) {
        if self
            .linger_deadline()
            .is_some_and(|deadline| deadline <= now)
        {
            self.seal();
        }
    }

    /// Takes a credit back. Returns false (and counts it as stale) when the
    /// credit belongs to another channel or generation.
    pub fn on_credit(&mut self, credit: &Credit) -> bool {
        if credit.channel != self.id || credit.generation != self.generation {
            ChannelStats::add(&self.stats.inner.stale_dropped, 1);
            return false;
        }
        let returned = (credit.batches as usize).min(self.in_flight_batches);
        debug_assert_eq!(
            returned, credit.batches as usize,
            "more credits than batches in flight"
        );
        self.in_flight_batches -= returned;
        self.stats
            .inner
            .in_flight_batches
            .store(self.in_flight_batches as u64, Ordering::Release);
        ChannelStats::add(&self.stats.inner.credits_received, returned as u64);
        self.pump();
        true
    }

    /// True when nothing waits for credit and one more batch may go out: the
    /// owning actor may keep producing.
    pub fn has_credit(&self) -> bool {
        self.pending.is_empty() && self.window_open()
    }

    /// True when every pushed record and control item has been sent.
    pub fn is_drained(&self) -> bool {
        self.open.is_empty() && self.pending.is_empty()
    }

    /// Batches sent and not yet credited back.
    pub fn in_flight_batches(&self) -> usize {
        self.in_flight_batches
    }

    /// Sealed items waiting for credit.
    pub fn pending_items(&self) -> usize {
        self.pending.len()
    }

    fn window_open(&self) -> bool {
        match self.config.window {
            Window::Bounded(max) => self.in_flight_batches < max.get(),
            Window::Unbounded => true,
        }
    }

    fn seal(&mut self) {
        if self.open.is_empty() {
            return;
        }
        self.open_since = None;
        let batch = mem::take(&mut self.open);
        self.enqueue(Item::Batch(batch));
    }

    fn enqueue(&mut self, item: Item<T, C>) {
        let blocked = matches!(item, Item::Batch(_)) && !self.window_open();
        if self.pending.is_empty() && !blocked {
            self.transmit(item);
        } else {
            self.pending.push_back(item);
        }
    }

    /// Sends queued items in order until a batch meets a closed window.
    fn pump(&mut self) {
        while let Some(front) = self.pending.front() {
            if matches!(front, Item::Batch(_)) && !self.window_open() {
                return;
            }
            if let Some(item) = self.pending.pop_front() {
                self.transmit(item);
            }
        }
    }

    fn transmit(&mut self, item: Item<T, C>) {
        // `None` for a control item, the record count for a batch.
        let records = match &item {
            Item::Batch(batch) => Some(batch.len() as u64),
            Item::Control(_) => None,
        };
        // The only send method used on this recipient (see the module doc).
        // A stopped receiver drops the item; its generation is being torn
        // down, and the supervisor learns of it from the failure report.
        self.target.do_send(Delivery {
            channel: self.id,
            generation: self.generation,
            item,
        });
        // Counted after the send, so a reader that sees the count knows the
        // item is already in the receiver's mailbox.
        let inner = &self.stats.inner;
        let Some(records) = records else {
            ChannelStats::add(&inner.controls_sent, 1);
            return;
        };
        self.in_flight_batches += 1;
        let in_flight = self.in_flight_batches as u64;
        inner.in_flight_batches.store(in_flight, Ordering::Release);
        inner
            .in_flight_batches_peak
            .fetch_max(in_flight, Ordering::Release);
        ChannelStats::add(&inner.batches_sent, 1);
        ChannelStats::add(&inner.records_sent, records);
        if !self.window_open() {
            ChannelStats::add(&inner.credit_stalls, 1);
        }
    }
}

impl<T: Send + 'static, C: Send + 'static> fmt::Debug for ChannelSender<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelSender")
            .field("id", &self.id)
            .field("generation", &self.generation)
            .field("open_records", &self.open.len())
            .field("pending_items", &self.pending.len())
            .field("in_flight_batches", &self.in_flight_batches)
            .finish()
    }
}

/// The receiving half of a channel, owned by the receiving actor.
#[derive(Debug)]
pub struct ChannelReceiver {
    id: ChannelId,
    generation: Generation,
    credit_target: Recipient<Credit>,
    stats: ChannelStats,
}

impl ChannelReceiver {
    /// The channel's id.
    pub fn id(&self) -> ChannelId {
        self.id
    }

    /// The channel's generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The channel's counters.
    pub fn stats(&self) -> &ChannelStats {
        &self.stats
    }

    /// Unwraps a delivery of this channel and generation; drops (and counts)
    /// anything else, so messages of an old generation never reach a new one.
    pub fn accept<T, C>(&self, delivery: Delivery<T, C>) -> Option<Item<T, C>> {
        if delivery.channel == self.id && delivery.generation == self.generation {
            Some(delivery.item)
        } else {
            ChannelStats::add(&self.stats.inner.stale_dropped, 1);
            None
        }
    }

    /// Returns one credit to the sender: call it after a batch (not a control
    /// item) has been processed.
    pub fn release_batch(&self) {
        self.credit_target.do_send(Credit {
            channel: self.id,
            generation: self.generation,
            batches: 1,
        });
    }
}

/// The output channels of one actor, indexed from 0 in the order given.
pub struct Outputs<T: Send + 'static, C: Send + 'static> {
    senders: Vec<ChannelSender<T, C>>,
    index_by_channel: HashMap<ChannelId, usize>,
    stop_requested: bool,
}

impl<T: Send + 'static, C: Send + 'static> Outputs<T, C> {
    /// Wraps the sending halves of an actor's output channels.
    pub fn new(senders: Vec<ChannelSender<T, C>>) -> Self {
        let index_by_channel = senders
            .iter()
            .enumerate()
            .map(|(index, sender)| (sender.id(), index))
            .collect();
        Self {
            senders,
            index_by_channel,
            stop_requested: false,
        }
    }

    /// The number of output channels.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// True when the actor has no outputs (a sink).
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }

    /// Pushes a record on output `output`.
    ///
    /// # Panics
    ///
    /// If `output` is out of range: a bug in the calling logic, which runs
    /// under [`super::failure::guard`], so it is reported, not fatal.
    #[inline]
    pub fn emit(&mut self, output: usize, record: T) {
        self.senders[output].push(record);
    }

    /// Pushes every record of `records` on output `output`, in order,
    /// leaving `records` empty (see [`ChannelSender::push_all`]).
    ///
    /// # Panics
    ///
    /// If `output` is out of range, as [`Outputs::emit`].
    pub fn emit_all(&mut self, output: usize, records: &mut Vec<T>) {
        self.senders[output].push_all(records);
    }

    /// Pushes a control item on output `output` (after the open batch).
    ///
    /// # Panics
    ///
    /// If `output` is out of range, as [`Outputs::emit`].
    pub fn emit_control(&mut self, output: usize, control: C) {
        self.senders[output].push_control(control);
    }

    /// Per output, in order, the records pushed into it so far (see
    /// [`ChannelSender::records_accepted`]).
    pub fn records_accepted(&self) -> Vec<u64> {
        self.senders
            .iter()
            .map(ChannelSender::records_accepted)
            .collect()
    }

    /// Pushes a copy of the control item on every output.
    pub fn broadcast_control(&mut self, control: C)
    where
        C: Clone,
    {
        for sender in &mut self.senders {
            sender.push_control(control.clone());
        }
    }

    /// Closes every open batch now.
    pub fn flush_all(&mut self) {
        for sender in &mut self.senders {
            sender.flush();
        }
    }

    /// True when every output may take more (see
    /// [`ChannelSender::has_credit`]).
    pub fn has_credit(&self) -> bool {
        self.senders.iter().all(ChannelSender::has_credit)
    }

    /// True when everything pushed has been sent on every output.
    pub fn is_drained(&self) -> bool {
        self.senders.iter().all(ChannelSender::is_drained)
    }

    /// Asks the owning actor to stop once every output is drained.
    pub fn request_stop(&mut self) {
        self.stop_requested = true;
    }

    /// Whether [`Outputs::request_stop`] was called.
    pub fn stop_requested(&self) -> bool {
        self.stop_requested
    }

    /// Records sent so far on every output together (a read of each
    /// channel's counter; the live metrics take it once per slice).
    pub fn records_sent(&self) -> u64 {
        self.senders
            .iter()
            .map(|sender| sender.stats().records_sent())
            .sum()
    }

    /// The sender of output `output`, to read its state or stats.
    pub fn sender(&self, output: usize) -> Option<&ChannelSender<T, C>> {
        self.senders.get(output)
    }

    /// Routes a credit to its channel. Returns false when no output has the
    /// credit's channel id or its generation differs.
    pub fn on_credit(&mut self, credit: &Credit) -> bool {
        match self.index_by_channel.get(&credit.channel) {
            Some(&index) => self.senders[index].on_credit(credit),
            None => false,
        }
    }

    /// The earliest linger deadline of any open batch.
    pub fn linger_deadline(&self) -> Option<Instant> {
        self.senders
            .iter()
            .filter_map(ChannelSender::linger_deadline)
            .min()
    }

    /// Closes every open batch whose linger time has passed at `now`.
    pub fn flush_lingered(&mut self, now: Instant) {
        for sender in &mut self.senders {
            sender.flush_lingered(now);
        }
    }
}

impl<T: Send + 'static, C: Send + 'static> fmt::Debug for Outputs<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Outputs")
            .field("senders", &self.senders)
            .field("stop_requested", &self.stop_requested)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::{Actor, Context, Handler, System};
    use std::cell::RefCell;
    use std::rc::Rc;

    type Seen = Rc<RefCell<Vec<Item<u32, &'static str>>>>;

    /// Records every delivery; also stands in as the credit target.
    struct Collector {
        seen: Seen,
    }

    impl Actor for Collector {
        type Context = Context<Self>;
    }

    impl Handler<Delivery<u32, &'static str>> for Collector {
        type Result = ();
        fn handle(&mut self, delivery: Delivery<u32, &'static str>, _: &mut Context<Self>) {
            self.seen.borrow_mut().push(delivery.item);
        }
    }

    impl Handler<Credit> for Collector {
        type Result = ();
        fn handle(&mut self, _: Credit, _: &mut Context<Self>) {}
    }

    fn tuning(batch_size_max: usize, window: usize) -> ChannelConfig {
        ChannelConfig {
            batch_size_max: NonZeroUsize::new(batch_size_max).unwrap(),
            batch_linger_ms: 10,
            window: Window::Bounded(NonZeroUsize::new(window).unwrap()),
        }
    }

    fn credit(batches: u32) -> Credit {
        Credit {
            channel: ChannelId(1),
            generation: Generation(1),
            batches,
        }
    }

    /// Runs `scenario` with a sender whose deliveries land in the returned
    /// list; the scenario calls `settle` to let the collector run.
    fn check(
        config: ChannelConfig,
        scenario: impl FnOnce(&mut ChannelSender<u32, &'static str>, &Seen, &dyn Fn()),
    ) {
        let runner = System::new();
        let seen: Seen = Rc::default();
        let collector = runner.block_on(async {
            Collector {
                seen: Rc::clone(&seen),
            }
            .start()
        });
        let (mut sender, _receiver) = channel(
            ChannelId(1),
            Generation(1),
            config,
            collector.clone().recipient(),
            collector.recipient(),
        );
        let settle = || {
            runner.block_on(async {
                for _ in 0..10 {
                    actix_rt::task::yield_now().await;
                }
            })
        };
        scenario(&mut sender, &seen, &settle);
    }

    #[test]
    fn batches_beyond_the_window_wait_and_controls_never_overtake_them() {
        check(tuning(2, 2), |sender, seen, settle| {
            (0..10).for_each(|record| {
                sender.push(record);
            });
            sender.push_control("end");
            assert_eq!(sender.in_flight_batches(), 2);
            assert_eq!(sender.pending_items(), 4); // Batches 3 to 5, then the control.
            assert!(!sender.has_credit());
            settle();
            assert_eq!(
                *seen.borrow(),
                vec![Item::Batch(vec![0, 1]), Item::Batch(vec![2, 3])]
            );
            assert!(sender.on_credit(&credit(2)));
            assert_eq!(sender.in_flight_batches(), 2);
            assert!(sender.on_credit(&credit(1)));
            assert_eq!(sender.pending_items(), 0, "the control needs no credit");
            assert!(!sender.has_credit(), "the window is full again");
            settle();
            let expected: Vec<_> = (0..5)
                .map(|n| Item::Batch(vec![2 * n, 2 * n + 1]))
                .chain([Item::Control("end")])
                .collect();
            assert_eq!(*seen.borrow(), expected);
            assert_eq!(sender.stats().records_sent(), 10);
            assert_eq!(sender.stats().in_flight_batches_peak(), 2);
        });
    }

    #[test]
    fn a_control_item_goes_out_at_once_when_nothing_waits() {
        check(tuning(100, 1), |sender, seen, settle| {
            sender.push(7);
            sender.push_control("barrier");
            sender.push(8);
            sender.push_control("barrier");
            settle();
            // The second batch waits for credit; so does the control behind it.
            assert_eq!(
                *seen.borrow(),
                vec![Item::Batch(vec![7]), Item::Control("barrier")]
            );
            assert_eq!(sender.pending_items(), 2);
        });
    }

    /// `push_all` of `chunks` in turn, after `before` single pushes: the
    /// batches sent (window 8, batches of 4) are the records in order, cut
    /// every 4 records, as `push` one by one would cut them.
    fn check_push_all(before: u32, chunks: &[u32]) {
        check(tuning(4, 8), |sender, seen, settle| {
            let mut next = 0;
            for _ in 0..before {
                sender.push(next);
                next += 1;
            }
            for &len in chunks {
                let mut records: Vec<u32> = (next..next + len).collect();
                next += len;
                sender.push_all(&mut records);
                assert!(records.is_empty(), "push_all leaves the vector empty");
            }
            sender.flush();
            settle();
            let expected: Vec<_> = (0..next)
                .collect::<Vec<_>>()
                .chunks(4)
                .map(|chunk| Item::Batch(chunk.to_vec()))
                .collect();
            assert_eq!(
                *seen.borrow(),
                expected,
                "before {before}, chunks {chunks:?}"
            );
        });
    }

    #[test]
    fn push_all_cuts_batches_as_push_does() {
        check_push_all(0, &[4]); // Taken whole as the batch.
        check_push_all(0, &[3, 1]); // Taken whole, then appended.
        check_push_all(1, &[2]); // Appended to an open batch.
        check_push_all(3, &[6]); // Fills the open batch, then one more.
        check_push_all(0, &[11, 0, 5]);
        check_push_all(2, &[1, 9, 2]);
    }

    #[test]
    fn stale_credits_are_ignored() {
        check(tuning(1, 1), |sender, _, _| {
            sender.push(1);
            let stale = Credit {
                generation: Generation(0),
                ..credit(1)
            };
            let foreign = Credit {
                channel: ChannelId(2),
                ..credit(1)
            };
            assert!(!sender.on_credit(&stale));
            assert!(!sender.on_credit(&foreign));
            assert_eq!(sender.in_flight_batches(), 1);
            assert_eq!(sender.stats().stale_dropped(), 2);
        });
    }

    #[test]
    fn an_open_batch_closes_only_after_its_linger_time() {
        check(tuning(100, 8), |sender, _, _| {
            sender.push(1);
            let deadline = sender.linger_deadline().unwrap();
            sender.flush_lingered(deadline - Duration::from_millis(1));
            assert_eq!(sender.stats().batches_sent(), 0);
            sender.flush_lingered(deadline);
            assert_eq!(sender.stats().batches_sent(), 1);
            assert_eq!(sender.linger_deadline(), None);
        });
    }
}
