//! dedup: see `snapflow_examples::dedup` for what it shows and checks.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example dedup
//! cargo run --release -p snapflow-examples --example dedup -- --smoke
//! ```

use snapflow_examples::{common, dedup};

fn main() {
    let usage = format!("{} {}", dedup::USAGE, common::CommonOptions::USAGE);
    std::process::exit(common::main_with(
        "dedup",
        &usage,
        dedup::Options::parse,
        dedup::run,
    ));
}
