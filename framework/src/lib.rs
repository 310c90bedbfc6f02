//! snapflow: fault-tolerant, stateful stream processing on actix actors.
//!
//! Users describe their state as plain Rust structs marked
//! `#[derive(Snapshot)]`, compose operators into a graph (cycles included),
//! and get periodic, globally consistent snapshots with exactly-once
//! recovery inside their own binary.
//!
//! The crate is layered; each layer knows nothing about the layers above it:
//!
//! - [`state`]: the [`Snapshot`] trait, schema descriptors and the byte format
//!   of one state blob. It never does I/O and knows nothing of actors.
//! - [`storage`]: the [`storage::CheckpointStore`]: durable parts, atomic
//!   commit of a checkpoint, listing, retention and savepoints. It moves
//!   opaque bytes and never knows what is inside a part.
//! - [`protocol`]: the pure checkpoint state machines (per node, coordinator),
//!   graph analysis and the consistency oracle. No I/O, clocks or actors.
//! - [`restart`]: restart strategies (none, fixed delay, exponential
//!   backoff, failure rate) and the pure tracker the supervisor asks after
//!   each failure. No clocks, threads or actors: time is an input.
//! - [`runtime`]: actix arbiters, actors and channels (batching, credits,
//!   fairness, panic reports). It never decides protocol questions.
//! - [`keyed`]: key groups and the keyed state backend (per-key state,
//!   snapshot per key group, restore at another parallelism).
//! - [`source`]: replayable sources (positions, splits per subtask, a Vec,
//!   an iterator, a generator, lines of a file). No actors.
//! - [`sink`]: two-phase-commit sinks (collect, print, an exactly-once file
//!   sink) and the contract a runtime drives them by. No actors.
//!
//! This crate never talks to a network and never spawns a process.

pub mod job;
pub mod keyed;
pub mod protocol;
pub mod restart;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod state;
pub mod storage;

pub use snapflow_macros::Snapshot;
pub use state::Snapshot;

#[doc(hidden)]
pub mod __private;
