//! The PostgreSQL sink as the tests configure it: `(key, count)` records
//! of the keyed pipeline into a table `(key bigint, count bigint)`, as
//! plain inserts in exactly-once mode and as upserts that keep the larger
//! count in idempotent mode. Shared by the in-process tests and the
//! `job_runner` child process of the SIGKILL tests.
//!
//! It owns only the sink's configuration; it never connects to a server
//! itself (the tests' own client, to read tables back, is a dev-dependency
//! and lives with the tests).

use snapflow::connectors::postgres::{
    Mode, MultiRowInsert, Params, PostgresConfig, PostgresError, PostgresSinkFactory,
};

/// The parameters of a `(key, count)` record.
pub fn key_count(&(key, count): &(u64, u64)) -> Params {
    vec![Box::new(key as i64), Box::new(count as i64)]
}

/// The function type of [`key_count`].
pub type KeyCount = fn(&(u64, u64)) -> Params;

/// The statement the tests' sink runs per record in `mode`.
pub fn statement(mode: Mode, table: &str) -> String {
    match mode {
        Mode::ExactlyOnce => format!("INSERT INTO {table} (key, count) VALUES ($1, $2)"),
        _ => format!(
            "INSERT INTO {table} (key, count) VALUES ($1, $2) ON CONFLICT (key) \
             DO UPDATE SET count = GREATEST({table}.count, EXCLUDED.count)"
        ),
    }
}

/// A sink factory writing `(key, count)` rows into `table` (see the
/// module documentation) one statement per row, in batches of 64 rows.
///
/// # Errors
///
/// The factory's start checks: the server unreachable, prepared
/// transactions disabled in exactly-once mode, a statement that does not
/// prepare (no such table).
pub fn factory(
    url: &str,
    mode: Mode,
    job: &str,
    table: &str,
) -> Result<PostgresSinkFactory<(u64, u64), KeyCount>, PostgresError> {
    PostgresSinkFactory::new(
        config(url, mode, job),
        &statement(mode, table),
        key_count as KeyCount,
    )
}

/// [`factory`] with the multi-row insert instead of the per-row
/// statement (the same plain insert or upsert, 64 rows a statement).
///
/// # Errors
///
/// As [`factory`].
pub fn multi_row_factory(
    url: &str,
    mode: Mode,
    job: &str,
    table: &str,
) -> Result<PostgresSinkFactory<(u64, u64), KeyCount>, PostgresError> {
    let mut insert = MultiRowInsert::new(&format!("{table} (key, count)"), 2);
    if mode == Mode::Idempotent {
        insert = insert.on_conflict(&format!(
            "(key) DO UPDATE SET count = GREATEST({table}.count, EXCLUDED.count)"
        ));
    }
    PostgresSinkFactory::multi_row(config(url, mode, job), insert, key_count as KeyCount)
}

/// The sink's configuration: operator `sink`, batches of 64 rows.
fn config(url: &str, mode: Mode, job: &str) -> PostgresConfig {
    let mut config = PostgresConfig::new(url, mode, job, "sink");
    config.batch_rows = 64;
    config
}
