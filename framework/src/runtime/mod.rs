//! The runtime's transport foundation: arbiter threads, actor placement,
//! typed FIFO channels with batching and credit-based backpressure, fair
//! scheduling of busy actors, and turning panics into failure reports.
//!
//! This layer owns how records and in-band control items move between actor
//! instances and how actors are started, watched and stopped. It never decides
//! protocol questions: a control item (barrier, end of input, watermark) is an
//! opaque value of the caller's type `C` that travels in order with the
//! records, and what a node does when it sees one is the business of the
//! logic plugged into [`stage::StageActor`] or [`source::SourceActor`] (later,
//! an operator shell that drives the protocol machine).
//!
//! Modules:
//!
//! - [`pool`]: a fixed set of arbiters (threads), actor placement, clean
//!   shutdown. It never interprets messages.
//! - [`failure`]: failure reports, the sink they go to, and the
//!   `catch_unwind` guard around user callbacks. It never restarts anything.
//! - [`channel`]: one FIFO channel between one sending actor and one
//!   receiving actor: batching, linger, credits, generation filtering. It never
//!   owns an actor and never blocks a thread.
//! - [`stage`]: a generic actor with input channels and output channels that
//!   processes its queued input in bounded slices. It never knows what a
//!   control item means.
//! - [`source`]: a generic actor that polls a source while its outputs have
//!   credit. It never reads input channels.
//!
//! The facts about actix 0.13.5 these modules are built around (measured on
//! this machine, see the design brief section 4): mailboxes are FIFO per
//! sending address; a panic in a handler kills only that actor and loses its
//! mailbox; `do_send` ignores mailbox capacity, so backpressure is built here
//! with credits; an actor drains its whole mailbox without yielding, so busy
//! actors yield explicitly; actors are not `Send` and are built on their
//! arbiter's thread.
//!
//! Wiring a source and a sink on two arbiters (slots first, so each channel
//! can name both ends before either actor runs):
//!
//! ```
//! use std::sync::mpsc;
//! use snapflow::runtime::channel::{channel, ChannelConfig, ChannelId, Outputs};
//! use snapflow::runtime::failure::FailureSink;
//! use snapflow::runtime::pool::{ActorSlot, ArbiterPool, Placement, PoolConfig};
//! use snapflow::runtime::source::{SourceActor, SourceConfig, SourceLogic, SourcePoll};
//! use snapflow::runtime::stage::{StageActor, StageConfig, StageIo, StageLogic};
//! use snapflow::runtime::{ActorTag, BoxError, Generation};
//!
//! struct Numbers(u64);
//! impl SourceLogic for Numbers {
//!     type Out = u64;
//!     type Control = ();
//!     fn poll(&mut self, out: &mut Outputs<u64, ()>) -> Result<SourcePoll, BoxError> {
//!         (0..self.0).for_each(|n| out.emit(0, n));
//!         out.emit_control(0, ()); // In-band end marker, after every record.
//!         Ok(SourcePoll::Exhausted)
//!     }
//! }
//!
//! struct Sum(u64, mpsc::Sender<u64>);
//! impl StageLogic for Sum {
//!     type In = u64;
//!     type Out = u64;
//!     type Control = ();
//!     fn on_batch(&mut self, _: usize, batch: Vec<u64>, _: &mut StageIo<'_, u64, ()>) -> Result<(), BoxError> {
//!         self.0 += batch.iter().sum::<u64>();
//!         Ok(())
//!     }
//!     fn on_control(&mut self, _: usize, _: (), _: &mut StageIo<'_, u64, ()>) -> Result<(), BoxError> {
//!         self.1.send(self.0)?;
//!         Ok(())
//!     }
//! }
//!
//! let pool = ArbiterPool::new(PoolConfig { arbiters: 2.try_into()? })?;
//! let failures = FailureSink::log_only();
//! let (source_slot, sink_slot) = (ActorSlot::new(), ActorSlot::new());
//! let (sender, receiver) = channel(
//!     ChannelId(0),
//!     Generation(1),
//!     ChannelConfig::default(),
//!     sink_slot.address().recipient(),
//!     source_slot.address().recipient(),
//! );
//! let (total_sender, total) = mpsc::channel();
//! let (tag, sink_failures) = (ActorTag::new("sum", 0, Generation(1)), failures.clone());
//! pool.start_in_slot(sink_slot, Placement::Arbiter(1), tag.clone(), failures.clone(), move |_| {
//!     let logic = Sum(0, total_sender);
//!     StageActor::new(tag, logic, vec![receiver], vec![], StageConfig::default(), sink_failures)
//! })?;
//! let (tag, source_failures) = (ActorTag::new("numbers", 0, Generation(1)), failures.clone());
//! pool.start_in_slot(source_slot, Placement::Arbiter(0), tag.clone(), failures, move |_| {
//!     SourceActor::new(tag, Numbers(100), vec![sender], SourceConfig::default(), source_failures)
//! })?;
//! assert_eq!(total.recv()?, 4950);
//! pool.shutdown()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod channel;
pub mod failure;
pub use failure::{is_retryable_error, NotRetryable};
pub mod pool;
mod scheduling;
pub mod source;
pub mod stage;

use std::fmt;
use std::sync::Arc;

/// The generation of a running job: every restart starts a new generation,
/// and messages of an old generation are dropped by the new one.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Generation(pub u64);

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "generation {}", self.0)
    }
}

/// The identity of one actor instance: which operator, which parallel
/// subtask of it, and which generation of the job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ActorTag {
    /// The operator's name, as the job graph names it.
    pub operator: Arc<str>,
    /// The index of this parallel instance, from 0.
    pub subtask: usize,
    /// The generation this instance belongs to.
    pub generation: Generation,
}

impl ActorTag {
    /// Builds a tag from an operator name, a subtask index and a generation.
    pub fn new(operator: impl Into<Arc<str>>, subtask: usize, generation: Generation) -> Self {
        Self {
            operator: operator.into(),
            subtask,
            generation,
        }
    }
}

impl fmt::Display for ActorTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}[{}] ({})",
            self.operator, self.subtask, self.generation
        )
    }
}

/// An error returned by a user callback; the runtime turns it into a
/// [`failure::FailureReport`] and stops the actor.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the runtime layer itself (not of user code, which is reported
/// through [`failure::FailureReport`]).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The operating system refused to start a thread (arbiter or system).
    #[error("could not start a runtime thread: {0}")]
    ThreadStart(#[source] std::io::Error),
    /// The pool was configured with zero arbiters.
    #[error("an arbiter pool needs at least one arbiter")]
    EmptyPool,
    /// An actor was placed on an arbiter index the pool does not have.
    #[error("arbiter index {index} is out of range for a pool of {len}")]
    PlacementOutOfRange {
        /// The requested index.
        index: usize,
        /// The number of arbiters in the pool.
        len: usize,
    },
    /// The arbiter no longer accepts work (it was stopped).
    #[error("arbiter {index} has stopped")]
    ArbiterStopped {
        /// The arbiter's index in the pool.
        index: usize,
    },
    /// A runtime thread panicked outside any actor (a bug in this crate or in
    /// actix) and could not be joined cleanly.
    #[error("runtime thread `{thread}` panicked: {message}")]
    ThreadPanicked {
        /// The thread's name.
        thread: String,
        /// The panic message.
        message: String,
    },
}

impl RuntimeError {
    /// Whether trying the same operation again may succeed.
    ///
    /// Thread creation can fail transiently (resource limits); every other
    /// error is a configuration mistake or a lifecycle bug.
    pub fn is_retryable(&self) -> bool {
        matches!(self, RuntimeError::ThreadStart(_))
    }
}
