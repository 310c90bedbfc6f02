//! What the sink asks of and keeps on the server besides the user's rows:
//! the `max_prepared_transactions` check, the tables of committed
//! checkpoints and of progress, and the prepared transactions of one
//! subtask in `pg_prepared_xacts`.
//!
//! This module owns these statements. Every function runs on the sink's
//! connection thread (it takes the `Session`); none of them decides
//! what to commit or roll back, the sink does. Statements that belong in
//! the checkpoint's transaction run on the session's data connection;
//! `COMMIT PREPARED`, `ROLLBACK PREPARED` and the reads of the
//! bookkeeping run on its control connection, because PostgreSQL refuses
//! them inside a transaction block and the next checkpoint's transaction
//! is usually open on the data connection when a commit comes.
//!
//! | table | row | written |
//! |---|---|---|
//! | `snapflow_sink_commits` | (job, operator, subtask, checkpoint) | inside the prepared transaction of that checkpoint (exactly-once mode), so it is visible exactly when the checkpoint's rows are |
//! | `snapflow_sink_progress` | (job, operator, subtask) → last checkpoint | inside each idempotent transaction |

use postgres::error::SqlState;

use super::error::PostgresError;
use super::worker::{sql_error, Session};
use super::xid::TransactionIds;

/// The table of checkpoints whose prepared transaction was committed.
pub const COMMITS_TABLE: &str = "snapflow_sink_commits";
/// The table of each idempotent subtask's last committed checkpoint.
pub const PROGRESS_TABLE: &str = "snapflow_sink_progress";
/// Rows of `snapflow_sink_commits` kept per subtask: one a checkpoint,
/// trimmed after each commit to those of the newest this many checkpoint
/// ids, which is far more than a store retains to fall back to.
pub const COMMITS_KEPT_IDS: u64 = 10_000;

/// Checks the server's `max_prepared_transactions` as read by `SHOW`.
///
/// # Errors
///
/// [`PostgresError::PreparedTransactionsDisabled`] for `0` or a value
/// that is not a number.
pub fn check_max_prepared_transactions(found: &str) -> Result<u32, PostgresError> {
    match found.trim().parse::<u32>() {
        Ok(slots) if slots > 0 => Ok(slots),
        _ => Err(PostgresError::PreparedTransactionsDisabled {
            found: found.to_string(),
        }),
    }
}

/// The server's `max_prepared_transactions`, checked.
pub(crate) fn prepared_transactions(session: &mut Session) -> Result<u32, PostgresError> {
    let row = session
        .client
        .query_one("SHOW max_prepared_transactions", &[])
        .map_err(sql_error("reading max_prepared_transactions".to_string()))?;
    let found: String = row
        .try_get(0)
        .map_err(sql_error("reading max_prepared_transactions".to_string()))?;
    check_max_prepared_transactions(&found)
}

/// The key of the transaction-level advisory lock that serialises the
/// creation of the bookkeeping tables. The number spells "snapflow" in
/// ASCII, so it is unlikely to collide with a user's own advisory locks.
const CREATE_TABLES_LOCK_KEY: i64 = 0x736e_6170_666c_6f77;

/// Creates the bookkeeping tables if they are missing.
///
/// Every subtask of every sink does this as it starts, often at the same
/// moment. `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent
/// creation of the same table: the loser fails on the catalog's unique
/// index (`duplicate_object` on the row type, or `unique_violation`)
/// instead of seeing the table. So the creation runs in one transaction
/// that first takes an advisory lock: a second sink waits for the first
/// to commit and then finds the tables. The codes of a lost race are
/// still accepted, for a server reached through a pooler that drops
/// advisory locks.
pub(crate) fn create_tables(session: &mut Session) -> Result<(), PostgresError> {
    let statements = format!(
        "SELECT pg_advisory_xact_lock({CREATE_TABLES_LOCK_KEY}); \
         CREATE TABLE IF NOT EXISTS {COMMITS_TABLE} (job text NOT NULL, operator text NOT NULL, \
         subtask integer NOT NULL, checkpoint bigint NOT NULL, \
         PRIMARY KEY (job, operator, subtask, checkpoint)); \
         CREATE TABLE IF NOT EXISTS {PROGRESS_TABLE} (job text NOT NULL, operator text NOT NULL, \
         subtask integer NOT NULL, checkpoint bigint NOT NULL, \
         PRIMARY KEY (job, operator, subtask));"
    );
    let created = session.client.transaction().and_then(|mut transaction| {
        transaction.batch_execute(&statements)?;
        transaction.commit()
    });
    match created {
        Ok(()) => Ok(()),
        Err(error) if lost_a_creation_race(&error) => Ok(()),
        Err(error) => Err(PostgresError::Sql {
            operation: "creating the sink's bookkeeping tables".to_string(),
            source: error,
        }),
    }
}

/// Whether `error` is what a concurrent `CREATE TABLE IF NOT EXISTS` of
/// the same table reports to the one that lost.
fn lost_a_creation_race(error: &postgres::Error) -> bool {
    [
        SqlState::UNIQUE_VIOLATION,
        SqlState::DUPLICATE_TABLE,
        SqlState::DUPLICATE_OBJECT,
    ]
    .iter()
    .any(|code| error.code() == Some(code))
}

/// Who a bookkeeping row belongs to.
#[derive(Debug, Clone)]
pub(crate) struct Owner {
    pub(crate) job: String,
    pub(crate) operator: String,
    pub(crate) subtask: i32,
    pub(crate) ids: TransactionIds,
}

/// A checkpoint id as PostgreSQL's `bigint`.
pub(crate) fn bigint(checkpoint: u64) -> Result<i64, PostgresError> {
    i64::try_from(checkpoint).map_err(|_| PostgresError::InvalidName {
        name: checkpoint.to_string(),
        reason: "checkpoint id above PostgreSQL's bigint",
    })
}

/// The checkpoints of this subtask's prepared transactions, ascending.
pub(crate) fn prepared_checkpoints(
    session: &mut Session,
    owner: &Owner,
) -> Result<Vec<u64>, PostgresError> {
    let rows = session
        .control
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() \
             AND left(gid, length($1)) = $1",
            &[&owner.ids.prefix()],
        )
        .map_err(sql_error("listing prepared transactions".to_string()))?;
    let mut checkpoints = Vec::with_capacity(rows.len());
    for row in rows {
        let gid: String = row
            .try_get(0)
            .map_err(sql_error("reading pg_prepared_xacts".to_string()))?;
        if let Some(checkpoint) = owner.ids.parse(&gid) {
            checkpoints.push(checkpoint);
        }
    }
    checkpoints.sort_unstable();
    Ok(checkpoints)
}

/// The checkpoints above `after` whose transaction this subtask
/// committed (exactly-once mode), ascending.
pub(crate) fn committed_after(
    session: &mut Session,
    owner: &Owner,
    after: Option<u64>,
) -> Result<Vec<u64>, PostgresError> {
    let after = match after {
        Some(after) => bigint(after)?,
        None => -1,
    };
    let rows = session
        .control
        .query(
            &format!(
                "SELECT checkpoint FROM {COMMITS_TABLE} WHERE job = $1 AND operator = $2 \
                 AND subtask = $3 AND checkpoint > $4 ORDER BY checkpoint"
            ),
            &[&owner.job, &owner.operator, &owner.subtask, &after],
        )
        .map_err(sql_error(format!("reading {COMMITS_TABLE}")))?;
    rows.iter()
        .map(|row| {
            row.try_get::<_, i64>(0)
                .map(|id| id as u64)
                .map_err(sql_error(format!("reading {COMMITS_TABLE}")))
        })
        .collect()
}

/// Whether this subtask committed checkpoint `checkpoint`.
pub(crate) fn is_committed(
    session: &mut Session,
    owner: &Owner,
    checkpoint: u64,
) -> Result<bool, PostgresError> {
    let id = bigint(checkpoint)?;
    let row = session
        .control
        .query_opt(
            &format!(
                "SELECT 1 FROM {COMMITS_TABLE} WHERE job = $1 AND operator = $2 \
                 AND subtask = $3 AND checkpoint = $4"
            ),
            &[&owner.job, &owner.operator, &owner.subtask, &id],
        )
        .map_err(sql_error(format!("reading {COMMITS_TABLE}")))?;
    Ok(row.is_some())
}

/// Records, inside the open transaction, that checkpoint `checkpoint`
/// is committed once this transaction is.
pub(crate) fn record_commit(
    session: &mut Session,
    owner: &Owner,
    checkpoint: u64,
) -> Result<(), PostgresError> {
    let id = bigint(checkpoint)?;
    session
        .client
        .execute(
            &format!(
                "INSERT INTO {COMMITS_TABLE} (job, operator, subtask, checkpoint) \
                 VALUES ($1, $2, $3, $4)"
            ),
            &[&owner.job, &owner.operator, &owner.subtask, &id],
        )
        .map_err(sql_error(format!("recording checkpoint {checkpoint}")))?;
    Ok(())
}

/// Forgets commit records more than [`COMMITS_KEPT_IDS`] ids below
/// `checkpoint`, outside any transaction (a prepared transaction must not
/// lock rows another one deletes too).
pub(crate) fn trim_commits(
    session: &mut Session,
    owner: &Owner,
    checkpoint: u64,
) -> Result<(), PostgresError> {
    let Some(below) = checkpoint.checked_sub(COMMITS_KEPT_IDS) else {
        return Ok(());
    };
    let below = bigint(below)?;
    session
        .control
        .execute(
            &format!(
                "DELETE FROM {COMMITS_TABLE} WHERE job = $1 AND operator = $2 \
                 AND subtask = $3 AND checkpoint < $4"
            ),
            &[&owner.job, &owner.operator, &owner.subtask, &below],
        )
        .map_err(sql_error(format!("trimming {COMMITS_TABLE}")))?;
    Ok(())
}

/// Sets, inside the open transaction, this subtask's progress row.
pub(crate) fn record_progress(
    session: &mut Session,
    owner: &Owner,
    checkpoint: u64,
) -> Result<(), PostgresError> {
    let id = bigint(checkpoint)?;
    session
        .client
        .execute(
            &format!(
                "INSERT INTO {PROGRESS_TABLE} (job, operator, subtask, checkpoint) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (job, operator, subtask) \
                 DO UPDATE SET checkpoint = EXCLUDED.checkpoint"
            ),
            &[&owner.job, &owner.operator, &owner.subtask, &id],
        )
        .map_err(sql_error(format!("recording progress {checkpoint}")))?;
    Ok(())
}

/// Runs `COMMIT PREPARED` or `ROLLBACK PREPARED` (`verb`) on this
/// subtask's transaction of `checkpoint`; `Ok(false)` when no such
/// prepared transaction exists.
pub(crate) fn finish_prepared(
    session: &mut Session,
    owner: &Owner,
    verb: &str,
    checkpoint: u64,
) -> Result<bool, PostgresError> {
    // The id holds only checked name characters, `:` and digits, so it is
    // safe inside the literal; these statements take no parameters.
    let gid = owner.ids.id(checkpoint);
    match session
        .control
        .batch_execute(&format!("{verb} PREPARED '{gid}'"))
    {
        Ok(()) => Ok(true),
        Err(error) if error.code() == Some(&SqlState::UNDEFINED_OBJECT) => Ok(false),
        Err(error) => Err(PostgresError::Sql {
            operation: format!("{verb} PREPARED '{gid}'"),
            source: error,
        }),
    }
}
