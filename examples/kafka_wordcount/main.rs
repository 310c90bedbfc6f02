//! Word count from Kafka to Kafka, exactly once: see
//! `snapflow_examples::kafka_wordcount`.
//!
//! Run it with the broker and topics that `run.sh` in this folder starts
//! and creates:
//!
//! ```text
//! bash examples/kafka_wordcount/run.sh
//! ```
//!
//! or by hand, with `SNAPFLOW_KAFKA_BROKERS` naming a broker that has the
//! topics `lines` and `word-counts`:
//!
//! ```text
//! cargo run -p snapflow-examples --features kafka --example kafka_wordcount
//! ```

use snapflow_examples::kafka_wordcount::{run, Options};

fn main() -> Result<(), snapflow_examples::common::ExampleError> {
    let summary = run(&Options::from_env())?;
    println!(
        "counted exactly once; {} checkpoints, {} transactions committed, last counts {:?}",
        summary.checkpoints, summary.transactions, summary.counts
    );
    Ok(())
}
