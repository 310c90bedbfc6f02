//! The PostgreSQL sink's bytes out in the live metrics, against a real
//! server (`.ci/run` starts it; locally `eval "$(bash .ci/postgres.sh
//! start)"`; without `SNAPFLOW_POSTGRES_URL` each test prints how to
//! start it and passes, except in CI, where it fails).
//!
//! What the sink counts is the bytes of the parameter values it sent, in
//! PostgreSQL's binary encoding: a `(key bigint, count bigint)` row is 16
//! bytes, a `text` value its UTF-8 length. A failure-free job at
//! parallelism 1 and 3, per-row statements and multi-row inserts, shows
//! 16 bytes per row the table holds; the sink called directly counts a
//! text column by its length and a NULL as nothing.

#[path = "postgres_sink/support.rs"]
#[allow(dead_code)] // The job tests' fault injection is not used here.
mod support;

use std::time::Duration;

use snapflow::connectors::postgres::{Mode, Params, PostgresConfig, PostgresSinkFactory};
use snapflow::job::{Job, JobConfig};
use snapflow::sink::{Sink, SinkFactory};
use snapflow::source::VecSourceFactory;
use snapflow_tests::postgres::{factory, multi_row_factory, KeyCount};
use snapflow_tests::sampled::{run_sampled, Sampled};

use support::{client, create_table, rows, server, unique, URL_VAR};

const RECORDS: u64 = 1_000;

fn check_job_bytes(parallelism: usize, multi_row: bool) {
    let Some(url) = server(URL_VAR) else { return };
    let (name, table) = (unique("pgbytes"), unique("rows"));
    create_table(&url, &table, false);
    let build = if multi_row {
        multi_row_factory
    } else {
        factory
    };
    let sink: PostgresSinkFactory<(u64, u64), KeyCount> =
        build(&url, Mode::ExactlyOnce, &name, &table).expect("the sink starts");
    let job = Job::new(
        &name,
        JobConfig {
            default_parallelism: parallelism,
            checkpoint_interval_ms: Some(20),
            batch_size_max: 16,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    job.source("numbers", VecSourceFactory::new((0..RECORDS).collect()))
        .map("pairs", |n: u64| (n, n * 3))
        .sink("sink", sink);
    let running = job.start().expect("the job starts");
    let Sampled { last, .. } = run_sampled(running, Duration::from_secs(120));
    let written = rows(&url, &table);
    assert_eq!(written.len() as u64, RECORDS, "bug in the test: every row");
    let sink = last.operator("sink").expect("listed");
    assert_eq!(
        sink.bytes_out,
        Some(16 * RECORDS),
        "p={parallelism}, multi-row {multi_row}: two bigints per row"
    );
    let per_subtask: u64 = sink.subtasks.iter().filter_map(|s| s.bytes_out).sum();
    assert_eq!(per_subtask, 16 * RECORDS);
}

#[test]
fn bytes_out_per_row_at_parallelism_1_and_3() {
    check_job_bytes(1, false);
    check_job_bytes(3, false);
}

#[test]
fn bytes_out_multi_row_at_parallelism_1_and_3() {
    check_job_bytes(1, true);
    check_job_bytes(3, true);
}

/// A `(name text, note text NULL)` row.
fn text_row((name, note): &(String, Option<String>)) -> Params {
    vec![Box::new(name.clone()), Box::new(note.clone())]
}

#[test]
fn text_counts_its_utf8_length_and_null_counts_nothing() {
    let Some(url) = server(URL_VAR) else { return };
    let (name, table) = (unique("pgtext"), unique("texts"));
    client(&url)
        .batch_execute(&format!(
            "CREATE TABLE {table} (name text NOT NULL, note text)"
        ))
        .expect("the table is created");
    let config = PostgresConfig::new(&url, Mode::ExactlyOnce, &name, "sink");
    let sinks = PostgresSinkFactory::new(
        config,
        &format!("INSERT INTO {table} (name, note) VALUES ($1, $2)"),
        text_row as fn(&(String, Option<String>)) -> Params,
    )
    .expect("the sink starts");
    let mut sink = sinks.create(0, 1).expect("a sink");
    sink.restore(None).expect("restores");
    assert_eq!(sink.bytes_written(), Some(0));
    let batch = [
        ("ab".to_string(), None),
        ("héllo".to_string(), Some("note".to_string())),
    ];
    sink.write_batch(&batch).expect("written");
    sink.pre_commit(1).expect("prepared");
    sink.commit(1).expect("committed");
    // "ab" 2, NULL 0, "héllo" 6 (é is two bytes), "note" 4.
    assert_eq!(sink.bytes_written(), Some(12));
    let count: i64 = client(&url)
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .expect("counts")
        .get(0);
    assert_eq!(count, 2);
}
