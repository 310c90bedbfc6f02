//! The PostgreSQL sink's configuration: where the server is, which mode,
//! the names its transactions and progress rows are filed under, and the
//! bounds on batches and waits.
//!
//! This module owns checking names before they reach SQL or a transaction
//! id. It never connects to anything.

use std::time::Duration;

use super::error::PostgresError;

/// Rows sent to the server in one round trip unless configured otherwise.
pub const DEFAULT_BATCH_ROWS: usize = 500;
/// How long one statement may wait for a row lock unless configured
/// otherwise (PostgreSQL's `lock_timeout`).
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection attempt may take unless configured otherwise.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new sink keeps trying to connect while the server refuses
/// connections, unless configured otherwise.
pub const DEFAULT_CONNECT_RETRY: Duration = Duration::from_secs(10);
/// Job and operator names are at most this long, so a transaction id
/// stays well under PostgreSQL's 200-byte limit on global ids.
pub const MAX_NAME_BYTES: usize = 63;

/// How the sink makes its output visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Exactly-once through two-phase commit: one transaction per subtask
    /// and checkpoint, `PREPARE TRANSACTION` at pre-commit, `COMMIT
    /// PREPARED` when the checkpoint completes. Needs the server setting
    /// `max_prepared_transactions > 0`; any statement works (inserts too).
    ExactlyOnce,
    /// One ordinary transaction per subtask and checkpoint interval,
    /// committed at pre-commit together with the subtask's progress row.
    /// Needs no server setting, but is exactly-once in effect only if
    /// every statement is an upsert whose replay changes nothing (the
    /// sink cannot check that; see the module documentation).
    Idempotent,
}

/// Where and how a PostgreSQL sink writes.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A libpq-style connection string, e.g. `host=/tmp/pg user=postgres`
    /// or `postgresql://user@localhost:5432/db`.
    pub url: String,
    /// Exactly-once or idempotent.
    pub mode: Mode,
    /// The job's name, part of every transaction id and progress row: the
    /// same on every restart of the job, and unique among the jobs that
    /// write to one database.
    pub job: String,
    /// The sink operator's name, likewise.
    pub operator: String,
    /// Rows buffered before they are sent; bounds the sink's memory.
    pub batch_rows: usize,
    /// How long one statement may wait for a row lock before it fails
    /// (retryable); bounds the wait on a lock that an earlier, still
    /// prepared transaction holds.
    pub lock_timeout: Duration,
    /// How long a connection attempt may take.
    pub connect_timeout: Duration,
    /// How long a new sink keeps trying (every 100 ms) to connect while
    /// the attempts fail with a retryable error (a server restarting
    /// refuses connections for a moment). The bound exists because the
    /// job's checks before a restore end the job on a sink that cannot
    /// connect, instead of restarting; zero tries once.
    pub connect_retry: Duration,
}

impl PostgresConfig {
    /// A configuration with the default bounds.
    pub fn new(url: &str, mode: Mode, job: &str, operator: &str) -> PostgresConfig {
        PostgresConfig {
            url: url.to_string(),
            mode,
            job: job.to_string(),
            operator: operator.to_string(),
            batch_rows: DEFAULT_BATCH_ROWS,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            connect_retry: DEFAULT_CONNECT_RETRY,
        }
    }

    /// Checks the names and bounds.
    ///
    /// # Errors
    ///
    /// [`PostgresError::InvalidName`] for a job or operator name that is
    /// empty, longer than [`MAX_NAME_BYTES`] or holds anything but ASCII
    /// letters, digits, `_` and `-`, or for a zero batch size.
    pub fn validate(&self) -> Result<(), PostgresError> {
        validate_name(&self.job)?;
        validate_name(&self.operator)?;
        if self.batch_rows == 0 {
            return Err(PostgresError::InvalidName {
                name: "batch_rows = 0".to_string(),
                reason: "a batch must hold at least one row",
            });
        }
        Ok(())
    }
}

/// A job or operator name that is safe inside a transaction id literal.
pub(crate) fn validate_name(name: &str) -> Result<(), PostgresError> {
    let invalid = |reason| {
        Err(PostgresError::InvalidName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("the name is empty");
    }
    if name.len() > MAX_NAME_BYTES {
        return invalid("the name is longer than 63 bytes");
    }
    if !name
        .bytes()
        .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    {
        return invalid("the name may hold only ASCII letters, digits, `_` and `-`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_break_out_of_a_literal_are_refused() {
        assert!(validate_name("wordcount-2").is_ok());
        for bad in ["", "a'b", "a:b", "a b", "é", &"x".repeat(64)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
