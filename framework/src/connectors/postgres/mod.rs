//! An exactly-once PostgreSQL sink (feature `postgres`): each record
//! becomes one run of a user's statement (an `INSERT`, or an upsert with
//! `INSERT ... ON CONFLICT`) with parameters, or one row of a multi-row
//! insert ([`MultiRowInsert`], one statement per chunk of rows, several
//! times faster), sent in batches, in one transaction per subtask and
//! checkpoint.
//!
//! This module owns everything the job's sink contract
//! ([`Sink`](crate::sink::Sink)) needs from PostgreSQL. It never runs a
//! client call on the caller's thread (see "Where calls run") and never
//! retries by itself: a failure is an error whose
//! [`is_retryable`](crate::sink::SinkError::is_retryable) says whether
//! the job's restart strategy may try again.
//!
//! # Modes
//!
//! **Exactly-once** ([`Mode::ExactlyOnce`], as Flink's JDBC XA sink): the
//! rows of one checkpoint interval go into one transaction. At
//! `pre_commit(n)` the sink adds a row `(job, operator, subtask, n)` to
//! `snapflow_sink_commits` in the same transaction and runs `PREPARE
//! TRANSACTION 'snapflow:<job>:<operator>:<subtask>:<n>'`: durable,
//! invisible. When checkpoint `n` completes, `commit(n)` runs `COMMIT
//! PREPARED` for every pending id up to `n`. The pending ids are the
//! sink's checkpoint state. On restore the sink commits what the
//! restored state lists and rolls back every other prepared transaction
//! of its job, operator and subtask found in `pg_prepared_xacts` (an
//! orphan holds locks and blocks vacuum). A `COMMIT PREPARED` of an id
//! that is no longer prepared but whose row in `snapflow_sink_commits` is
//! there was done before, so commit is safe to repeat; one whose row is
//! missing too is lost data ([`SinkError::MissingTransaction`](crate::sink::SinkError::MissingTransaction) in
//! `restore`,
//! [`SinkError::StagedDataDamaged`](crate::sink::SinkError::StagedDataDamaged) in `check_restore`, so the
//! job falls back to an older checkpoint).
//!
//! `check_restore` answers
//! [`Visibility::Known`](crate::sink::Visibility::Known) from
//! `snapflow_sink_commits`: a row there is committed exactly when the
//! checkpoint's data is, because both are in one transaction, so the
//! answer is exact (within the newest [`server::COMMITS_KEPT_IDS`] ids,
//! which are kept per subtask).
//!
//! The server needs `max_prepared_transactions > 0`
//! ([`PostgresSinkFactory::new`] checks it and says how to fix it:
//! [`PostgresError::PreparedTransactionsDisabled`]).
//!
//! **Idempotent** ([`Mode::Idempotent`]): the rows of one interval and
//! the subtask's row in `snapflow_sink_progress` (its last checkpoint)
//! go into one ordinary transaction, committed at `pre_commit`, so
//! output becomes visible before its checkpoint completes and is written
//! again after a failure. That is harmless only when every statement is
//! an upsert whose replay changes nothing a reader sees at the end (for
//! example `ON CONFLICT (key) DO UPDATE SET count = GREATEST(t.count,
//! EXCLUDED.count)`); the sink cannot check this, so it is the user's
//! promise, and `check_restore` answers
//! [`Visibility::ReplayIsHarmless`](crate::sink::Visibility::ReplayIsHarmless).
//! The sink does not skip a checkpoint id it finds in the progress row:
//! after a process crash an id that was triggered but never stored may
//! be numbered again for other records, and skipping those would lose
//! them; replays are harmless instead.
//!
//! # Where calls run
//!
//! The blocking `postgres` client runs its own tokio runtime and panics
//! when called on a thread that already runs one, as an actix arbiter
//! does. Every sink (and the factory's start check) therefore owns a
//! thread (`snapflow-pg-<operator>-<subtask>`) that holds its
//! connections; the sink's calls send it a command over a channel of
//! capacity one and wait for the answer, so at most one command is in
//! flight per sink. The sink buffers at most
//! [`PostgresConfig::batch_rows`] rows.
//!
//! Each sink holds two connections: the data connection carries the
//! open transaction of the current interval and `PREPARE TRANSACTION`;
//! the control connection runs `COMMIT PREPARED`, `ROLLBACK PREPARED`
//! and the bookkeeping reads, which PostgreSQL refuses inside a
//! transaction block (the next interval's transaction is usually open
//! when a checkpoint's commit comes).
//!
//! # Errors
//!
//! A lost connection, a server shutting down, a lock wait past
//! [`PostgresConfig::lock_timeout`] are retryable: the job restarts and
//! the new sink's restore commits or rolls back what the old one left.
//! Wrong SQL, a constraint violation, a wrong password or a row of the
//! wrong width for a [`MultiRowInsert`] are not: the job ends with the
//! error. A [`PostgresError`] reaches the job as
//! [`SinkError::Connector`](crate::sink::SinkError::Connector), from
//! which `downcast_ref::<PostgresError>()` gets it back whole.
//!
//! # Known limits
//!
//! In exactly-once mode a statement that touches a row written by an
//! earlier, still prepared transaction waits for that transaction's
//! `COMMIT PREPARED`. The commit comes from this same sink, and only
//! after the statement returns, so the wait always ends after
//! `lock_timeout` with a retryable error and the job restarts. This is
//! what upserts of recurring keys do (a running count per key: each
//! interval updates the rows the previous one wrote; measured: 3,000
//! records at parallelism 2 took 6 s and two restarts with a 2 s
//! `lock_timeout`). So in exactly-once mode write inserts of new rows
//! (one row per update, as the `wordcount_postgres` example does), and
//! keep upserts for idempotent mode. Restoring at another parallelism is
//! not supported (as for every sink).
//!
//! A multi-row upsert ([`MultiRowInsert::on_conflict`]) must not meet
//! one conflict key twice in a chunk: PostgreSQL refuses that statement
//! (not retryable); the per-row statement allows it.

mod config;
mod error;
pub mod server;
mod sink;
mod statement;
mod worker;
mod xid;

pub use config::{
    Mode, PostgresConfig, DEFAULT_BATCH_ROWS, DEFAULT_CONNECT_RETRY, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT, MAX_NAME_BYTES,
};
pub use error::PostgresError;
pub use sink::{Params, PostgresSink, PostgresSinkFactory};
pub use statement::{MultiRowInsert, MAX_STATEMENT_PARAMS};
pub use xid::TransactionIds;
