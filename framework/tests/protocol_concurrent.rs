//! Tests of concurrent Chandy-Lamport snapshots (`ConcurrentMachine`)
//! through the public API: exhaustive interleavings of small graphs with
//! several initiators (under a partial-order reduction, `reduction.rs`,
//! checked against the full exploration), the ring case of issue 15 step
//! by step, seeded random strongly connected graphs, the bound on
//! concurrent snapshots, and the machine's driving contract.
//!
//! Every test drives the machines through the simulator in
//! `protocol_concurrent/sim.rs` and checks each completed snapshot with the
//! public oracle under its own label, and for conservation of money. Run
//! with `cargo test -p snapflow --test protocol_concurrent -- --nocapture`
//! to see the state counts; replay one random case with `SNAPFLOW_SEED=<n>`.

#[path = "protocol_concurrent/exhaustive.rs"]
mod exhaustive;
#[path = "protocol_concurrent/machine.rs"]
mod machine;
#[path = "protocol_concurrent/random.rs"]
mod random;
#[path = "protocol_concurrent/reduction.rs"]
mod reduction;
#[path = "protocol_concurrent/ring.rs"]
mod ring;
#[path = "protocol_concurrent/sim.rs"]
mod sim;
