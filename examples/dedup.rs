//! dedup: see `snapflow_examples::dedup` for what it shows and checks.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example dedup
//! cargo run --release -p snapflow-examples --example dedup -- --smoke
//! ```

use snapflow_examples::{common, dedup};

fn main() {
    std::process::exit(common::main_with(dedup::run));
}
