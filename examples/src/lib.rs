//! The runnable snapflow examples, as a library: each example's logic lives
//! in a module here with an `Options` type (`full()`, `smoke()`, `parse`)
//! and a `run` function that returns `Ok` only when the example's own
//! check passes. The `[[example]]` targets beside this crate are one-line
//! mains, and `tests/smoke.rs` runs every example in smoke mode.
//!
//! This crate never reaches into snapflow's private modules; where an
//! example reads the contents of a checkpoint (the bank), it decodes the
//! stored bytes through the public `snapflow::storage` and
//! `snapflow::keyed` APIs and says which layout it relies on.

pub mod bank;
pub mod bank_snapshots;
pub mod clickstream;
pub mod common;
pub mod dedup;
#[cfg(feature = "kafka")]
pub mod kafka_wordcount;
pub mod lines;
pub mod online_model;
pub mod progress;
pub mod wordcount;
pub mod wordcount_postgres;
