//! online_model: see `snapflow_examples::online_model` for what it shows and checks.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example online_model
//! cargo run --release -p snapflow-examples --example online_model -- --smoke
//! ```

use snapflow_examples::{common, online_model};

fn main() {
    std::process::exit(common::main_with(online_model::run));
}
