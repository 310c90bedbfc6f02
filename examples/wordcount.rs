//! wordcount: the main example. Counts the words of a generated text (or
//! `--input PATH`) on the job API, with keyed state per word, checkpoints
//! in `target/snapflow-checkpoints` and injected crashes; prints each
//! checkpoint and recovery as it happens and checks the counts against a
//! direct computation (exit code 1 on a mismatch).
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example wordcount
//! cargo run --release -p snapflow-examples --example wordcount -- --crash-every 5000 --parallelism 3
//! cargo run --release -p snapflow-examples --example wordcount -- --input README.md --rate 500
//! ```

use snapflow_examples::{common, wordcount};

fn main() {
    std::process::exit(common::main_with(wordcount::run));
}
