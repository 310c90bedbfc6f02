//! bank: Chandy-Lamport snapshots on a graph with a cycle; see
//! `snapflow_examples::bank` for what it shows and checks.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example bank
//! cargo run --release -p snapflow-examples --example bank -- --unaligned --crash-every 5000
//! ```

use snapflow_examples::{bank, common};

fn main() {
    std::process::exit(common::main_with(bank::run));
}
