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
//!
//! This crate never talks to a network and never spawns a process.

pub mod sink;
pub mod source;
pub mod state;

pub use snapflow_macros::Snapshot;
pub use state::Snapshot;

#[doc(hidden)]
pub mod __private;
