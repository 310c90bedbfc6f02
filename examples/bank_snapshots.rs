//! bank_snapshots: concurrent Chandy-Lamport snapshots started by the
//! accounts themselves and by the caller, and a loop ended by a snapshot;
//! see `snapflow_examples::bank_snapshots` for what it shows and checks.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example bank_snapshots
//! cargo run --release -p snapflow-examples --example bank_snapshots -- --parallelism 3
//! ```

use snapflow_examples::{bank_snapshots, common};

fn main() {
    std::process::exit(common::main_with(bank_snapshots::run));
}
