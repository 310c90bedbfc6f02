//! clickstream: per-user activity alerts in 60 s sliding windows of event
//! time over a JSON-lines click log with late events, written exactly once
//! to files despite two injected crashes, and checked against a direct
//! computation (exit code 1 on a mismatch).
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example clickstream
//! cargo run --release -p snapflow-examples --example clickstream -- --events 200000 --parallelism 3
//! ```

use snapflow_examples::{clickstream, common};

fn main() {
    std::process::exit(common::main_with(clickstream::run));
}
