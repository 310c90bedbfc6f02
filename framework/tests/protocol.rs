//! Tests of the protocol layer through its public API: the seed's examples,
//! exhaustive interleavings of small graphs, seeded random graphs and
//! schedules, bank conservation, and the coordinator's schedule.
//!
//! Every test drives the pure machines through the shared simulator in
//! `protocol/sim.rs` and checks each completed checkpoint with the public
//! oracle. Run with `cargo test -p snapflow --test protocol -- --nocapture`
//! to see the state counts; replay one random case with `SNAPFLOW_SEED=<n>`.

#[path = "protocol/bank.rs"]
mod bank;
#[path = "protocol/coordinator.rs"]
mod coordinator;
#[path = "protocol/exhaustive.rs"]
mod exhaustive;
#[path = "protocol/node.rs"]
mod node;
#[path = "protocol/random.rs"]
mod random;
#[path = "protocol/seed_examples.rs"]
mod seed_examples;
#[path = "protocol/sim.rs"]
mod sim;
