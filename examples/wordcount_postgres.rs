//! wordcount_postgres: the word count writing its counts into a PostgreSQL
//! table through the exactly-once sink (or `--idempotent` upserts), with
//! injected crashes, checked against a direct count (exit code 1 on a
//! mismatch). Needs a server: `examples/wordcount_postgres.sh` starts a
//! throw-away one and runs this example against it.
//!
//! ```sh
//! examples/wordcount_postgres.sh
//! examples/wordcount_postgres.sh --idempotent --parallelism 3
//! cargo run --release -p snapflow-examples --example wordcount_postgres -- --url 'host=/tmp/pg user=postgres'
//! ```

use snapflow_examples::{common, wordcount_postgres};

fn main() {
    std::process::exit(common::main_with(wordcount_postgres::run));
}
