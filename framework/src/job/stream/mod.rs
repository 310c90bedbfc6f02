//! The typed job builder: [`Job`], [`Stream`] and [`KeyedStream`].
//!
//! This module owns the logical graph as the user declares it (operators
//! with names and parallelism, edges with their partitioner), the checks
//! that run before anything starts, and the erasure of each operator's
//! types into a template the physical layer instantiates per generation.
//! It never starts actors itself; [`Job::run`] hands a validated plan to the
//! supervisor.
//!
//! Mistakes are caught as early as the types allow: joining streams of
//! different record types does not compile (see [`Stream`]); duplicate or
//! invalid operator names, a forward edge between different
//! parallelisms, an iteration that is never closed and streams of two
//! different jobs are typed [`JobError`]s from [`Job::run`] or
//! [`Job::start`], before anything starts.
//!
//! The files: `graph` (the declared graph), `builder` ([`Job`]), `typed`
//! ([`Stream`]) and `keyed` ([`KeyedStream`]).

mod builder;
mod graph;
mod keyed;
mod typed;

pub use builder::Job;
pub use keyed::{KeyedStateHandle, KeyedStream};
pub use typed::{Feedback, SinkHandle, Stream};
