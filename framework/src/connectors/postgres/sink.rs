//! `PostgresSink`: one subtask's writer, in exactly-once or idempotent
//! mode, and the factory that checks the server before a job starts.
//!
//! This module owns the sink's transaction lifecycle: when a transaction
//! opens, what goes into it, when it is prepared, committed or rolled
//! back. It never talks to the server itself (every statement runs on the
//! connection thread of [`super::worker`], through [`super::server`]) and
//! never holds more than `batch_rows` rows.

use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::Arc;

use bytes::BytesMut;
use postgres::error::SqlState;
use postgres::types::{IsNull, ToSql, Type};

use crate::sink::{
    check_ascending, subtask_u32, Guarantee, PendingTransactions, Sink, SinkError, SinkFactory,
    SinkState, Visibility,
};

use super::config::{Mode, PostgresConfig};
use super::error::PostgresError;
use super::server::{self, Owner};
use super::statement::{MultiRowInsert, RowStatement};
use super::worker::{abbreviated, sql_error, Session, Worker};
use super::xid::TransactionIds;

/// The parameters of one row: one boxed value per `$n` of the statement.
pub type Params = Vec<Box<dyn ToSql + Send + Sync>>;

/// Builds [`PostgresSink`]s that run one statement per record
/// ([`new`](Self::new)) or one multi-row insert per chunk of rows
/// ([`multi_row`](Self::multi_row)).
///
/// ```no_run
/// use snapflow::connectors::postgres::{Mode, Params, PostgresConfig, PostgresSinkFactory};
///
/// let config = PostgresConfig::new("host=/tmp/pg user=postgres", Mode::ExactlyOnce, "wordcount", "counts");
/// let sink = PostgresSinkFactory::new(
///     config,
///     "INSERT INTO counts (word, count) VALUES ($1, $2)",
///     |(word, count): &(String, u64)| -> Params {
///         vec![Box::new(word.clone()), Box::new(*count as i64)]
///     },
/// )?;
/// # let _ = sink;
/// # Ok::<(), snapflow::connectors::postgres::PostgresError>(())
/// ```
pub struct PostgresSinkFactory<T, F> {
    config: Arc<PostgresConfig>,
    statement: Arc<RowStatement>,
    params: F,
    _records: PhantomData<fn(&T)>,
}

impl<T, F: Fn(&T) -> Params + Clone> PostgresSinkFactory<T, F> {
    /// A factory whose sinks run `statement` (with `$1`, `$2`, ...) once
    /// per record, with the parameters `params` makes of the record.
    ///
    /// It connects once, on a thread of its own, to check the server
    /// before anything runs: in exactly-once mode that
    /// `max_prepared_transactions > 0`; that `statement` prepares (so
    /// wrong SQL fails here, not inside the job); and it creates the
    /// sink's bookkeeping tables if they are missing.
    ///
    /// # Errors
    ///
    /// [`PostgresError::InvalidName`] for a bad configuration,
    /// [`PostgresError::Connect`] when the server cannot be reached,
    /// [`PostgresError::PreparedTransactionsDisabled`] with how to fix the
    /// server, [`PostgresError::Sql`] when the statement does not prepare.
    pub fn new(config: PostgresConfig, statement: &str, params: F) -> Result<Self, PostgresError> {
        Self::start(config, RowStatement::PerRow(statement.to_string()), params)
    }

    /// A factory whose sinks send their rows as multi-row inserts,
    /// `INSERT INTO <into> VALUES (..), (..) [ON CONFLICT ..]`, one per
    /// chunk of at most `batch_rows` rows (and at most 65,535 parameters),
    /// instead of one statement per row: one round trip per chunk, so
    /// several times the rows per second (see `BENCHMARKS.md`). The
    /// transactions, modes and guarantees are those of [`new`](Self::new).
    ///
    /// An upsert must not meet one conflict key twice in a chunk:
    /// PostgreSQL refuses that statement (not retryable), where the
    /// per-row form applies both rows in order. Use [`new`](Self::new)
    /// when a batch can hold one key twice, as a stream of running counts
    /// does.
    ///
    /// ```no_run
    /// use snapflow::connectors::postgres::{Mode, MultiRowInsert, Params, PostgresConfig, PostgresSinkFactory};
    ///
    /// let config = PostgresConfig::new("host=/tmp/pg user=postgres", Mode::ExactlyOnce, "events", "store");
    /// let sink = PostgresSinkFactory::multi_row(
    ///     config,
    ///     MultiRowInsert::new("events (id, payload)", 2),
    ///     |(id, payload): &(i64, String)| -> Params { vec![Box::new(*id), Box::new(payload.clone())] },
    /// )?;
    /// # let _ = sink;
    /// # Ok::<(), snapflow::connectors::postgres::PostgresError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new) (the start check prepares the one-row form),
    /// and [`PostgresError::InvalidName`] for a row width of 0 or more
    /// than 65,535 parameters.
    pub fn multi_row(
        config: PostgresConfig,
        insert: MultiRowInsert,
        params: F,
    ) -> Result<Self, PostgresError> {
        insert.validate()?;
        Self::start(config, RowStatement::MultiRow(insert), params)
    }

    /// Checks the configuration and the server, then builds the factory.
    fn start(
        config: PostgresConfig,
        statement: RowStatement,
        params: F,
    ) -> Result<Self, PostgresError> {
        config.validate()?;
        let worker = Worker::connect(&config, format!("snapflow-pg-check-{}", config.operator))?;
        let mode = config.mode;
        let sql = statement.check_sql();
        worker.call(move |session| {
            if mode == Mode::ExactlyOnce {
                server::prepared_transactions(session)?;
            }
            server::create_tables(session)?;
            session.statement(&sql).map(|_| ())
        })?;
        Ok(PostgresSinkFactory {
            config: Arc::new(config),
            statement: Arc::new(statement),
            params,
            _records: PhantomData,
        })
    }
}

impl<T, F: Fn(&T) -> Params + Clone> SinkFactory for PostgresSinkFactory<T, F> {
    type Sink = PostgresSink<T, F>;

    fn create(&self, subtask: usize, _parallelism: usize) -> Result<Self::Sink, SinkError> {
        let ids = TransactionIds::new(&self.config.job, &self.config.operator, subtask)?;
        let owner = Owner {
            job: self.config.job.clone(),
            operator: self.config.operator.clone(),
            subtask: i32::try_from(subtask).map_err(|_| SinkError::InvalidName {
                name: subtask.to_string(),
                reason: "subtask index above PostgreSQL's integer",
            })?,
            ids,
        };
        let name = format!("snapflow-pg-{}-{subtask}", self.config.operator);
        let worker = Worker::connect(&self.config, name)?;
        Ok(PostgresSink {
            worker,
            owner: Arc::new(owner),
            config: Arc::clone(&self.config),
            statement: Arc::clone(&self.statement),
            params: self.params.clone(),
            subtask,
            buffer: Vec::with_capacity(self.config.batch_rows),
            open: false,
            pending: BTreeSet::new(),
            last_pre_commit: None,
            finished: false,
            bytes_written: 0,
            _records: PhantomData,
        })
    }
}

/// One subtask's PostgreSQL sink. See the [module documentation](super).
pub struct PostgresSink<T, F> {
    worker: Worker,
    owner: Arc<Owner>,
    config: Arc<PostgresConfig>,
    statement: Arc<RowStatement>,
    params: F,
    subtask: usize,
    /// Rows not yet sent; at most `batch_rows`.
    buffer: Vec<Params>,
    /// A transaction is open on the server (rows were sent since the
    /// last pre-commit).
    open: bool,
    /// Prepared, uncommitted transactions (exactly-once mode).
    pending: BTreeSet<u64>,
    last_pre_commit: Option<u64>,
    finished: bool,
    /// The bytes of the parameter values sent so far, in PostgreSQL's
    /// binary encoding ([`Sink::bytes_written`]).
    bytes_written: u64,
    _records: PhantomData<fn(&T)>,
}

impl<T, F> PostgresSink<T, F> {
    /// Sends the buffered rows into the open transaction, opening it
    /// first if needed.
    fn flush(&mut self) -> Result<(), SinkError> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let rows = std::mem::replace(&mut self.buffer, Vec::with_capacity(self.config.batch_rows));
        let (open, statement) = (self.open, Arc::clone(&self.statement));
        // Counted as open before the call: after a failure the server
        // may hold the transaction, and `abort` must roll it back.
        self.open = true;
        self.bytes_written += self
            .worker
            .call(move |session| send_rows(session, open, &statement, rows))?;
        Ok(())
    }

    /// Commits this subtask's prepared transaction of `checkpoint`; one
    /// committed before (its commit is recorded) counts as done.
    fn commit_one(&self, checkpoint: u64) -> Result<(), SinkError> {
        let owner = Arc::clone(&self.owner);
        let subtask = self.subtask;
        self.worker.call(move |session| {
            if server::finish_prepared(session, &owner, "COMMIT", checkpoint)? {
                return Ok(Ok(()));
            }
            if server::is_committed(session, &owner, checkpoint)? {
                return Ok(Ok(()));
            }
            Ok(Err(SinkError::MissingTransaction {
                subtask,
                checkpoint_id: checkpoint,
            }))
        })?
    }

    fn pending_state(&self) -> Result<SinkState, SinkError> {
        Ok(PendingTransactions {
            subtask: subtask_u32(self.subtask)?,
            checkpoint_ids: self.pending.iter().copied().collect(),
        }
        .encode())
    }
}

/// Runs the rows on the connection thread, opening the transaction
/// first if `open` says none is; returns the bytes of the parameter
/// values the statements ran with (see [`encoded_bytes`]).
fn send_rows(
    session: &mut Session,
    open: bool,
    statement: &RowStatement,
    rows: Vec<Params>,
) -> Result<u64, PostgresError> {
    let mut sent = 0;
    let mut buffer = BytesMut::new();
    if !open {
        session
            .client
            .batch_execute("BEGIN")
            .map_err(sql_error("opening a transaction".to_string()))?;
    }
    match statement {
        RowStatement::PerRow(sql) => {
            let prepared = session.statement(sql)?;
            for row in &rows {
                let params = params_of(row);
                session
                    .client
                    .execute(&prepared, &params)
                    .map_err(sql_error(format!("running `{sql}`")))?;
                sent += encoded_bytes(prepared.params(), &params, &mut buffer);
            }
        }
        RowStatement::MultiRow(insert) => {
            let chunk_rows = rows.len().min(insert.rows_per_statement_max()).max(1);
            for chunk in rows.chunks(chunk_rows) {
                let mut params = Vec::with_capacity(chunk.len() * insert.params_per_row());
                for row in chunk {
                    insert.check_row(row.len())?;
                    params.extend(params_of(row));
                }
                let sql = insert.sql(chunk.len());
                let prepared = session.statement(&sql)?;
                session
                    .client
                    .execute(&prepared, &params)
                    .map_err(|source| {
                        // The one failure the per-row form does not have:
                        // an upsert whose chunk holds a key twice.
                        let hint = if source.code() == Some(&SqlState::CARDINALITY_VIOLATION) {
                            " (two rows of one chunk have the same conflict key; \
                             PostgresSinkFactory::new runs one statement per row and allows that)"
                        } else {
                            ""
                        };
                        PostgresError::Sql {
                            operation: format!(
                                "running a {}-row insert `{}`{hint}",
                                chunk.len(),
                                abbreviated(&sql)
                            ),
                            source,
                        }
                    })?;
                sent += encoded_bytes(prepared.params(), &params, &mut buffer);
            }
        }
    }
    Ok(sent)
}

/// The bytes of `values` in PostgreSQL's binary encoding for the
/// statement's parameter `types` (a NULL counts 0): what the sink counts
/// as written, the values' share of the Bind messages the client sends,
/// without the protocol's framing, the statement text or the
/// transaction commands. Each value is encoded once more for this,
/// after the statement ran (the client keeps its own encoding to
/// itself); a value its type refuses was refused by the statement too.
fn encoded_bytes(types: &[Type], values: &[&(dyn ToSql + Sync)], buffer: &mut BytesMut) -> u64 {
    let mut total = 0;
    for (ty, value) in types.iter().zip(values) {
        buffer.clear();
        if let Ok(IsNull::No) = value.to_sql_checked(ty, buffer) {
            total += buffer.len() as u64;
        }
    }
    total
}

/// A row's values as the client takes them.
fn params_of(row: &Params) -> Vec<&(dyn ToSql + Sync)> {
    row.iter()
        .map(|value| value.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

impl<T, F: Fn(&T) -> Params> Sink for PostgresSink<T, F> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        if self.finished {
            return Err(SinkError::Misuse {
                reason: "write_batch after finish".to_string(),
            });
        }
        for record in batch {
            self.buffer.push((self.params)(record));
            if self.buffer.len() >= self.config.batch_rows {
                self.flush()?;
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        check_ascending(self.last_pre_commit, checkpoint_id)?;
        self.flush()?;
        if self.open {
            let (owner, mode) = (Arc::clone(&self.owner), self.config.mode);
            self.worker.call(move |session| match mode {
                Mode::ExactlyOnce => {
                    server::record_commit(session, &owner, checkpoint_id)?;
                    let gid = owner.ids.id(checkpoint_id);
                    session
                        .client
                        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                        .map_err(sql_error(format!("preparing transaction '{gid}'")))
                }
                Mode::Idempotent => {
                    server::record_progress(session, &owner, checkpoint_id)?;
                    session
                        .client
                        .batch_execute("COMMIT")
                        .map_err(sql_error(format!("committing checkpoint {checkpoint_id}")))
                }
            })?;
            self.open = false;
            if self.config.mode == Mode::ExactlyOnce {
                self.pending.insert(checkpoint_id);
            }
        }
        self.last_pre_commit = Some(checkpoint_id);
        self.pending_state()
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        let due: Vec<u64> = self.pending.range(..=checkpoint_id).copied().collect();
        let Some(&newest) = due.last() else {
            return Ok(());
        };
        for id in due {
            self.commit_one(id)?;
            self.pending.remove(&id);
        }
        let owner = Arc::clone(&self.owner);
        self.worker
            .call(move |session| server::trim_commits(session, &owner, newest))?;
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.buffer.clear();
        if std::mem::take(&mut self.open) {
            self.worker.call(|session| {
                session
                    .client
                    .batch_execute("ROLLBACK")
                    .map_err(sql_error("rolling back the open transaction".to_string()))
            })?;
        }
        Ok(())
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        let listed = PendingTransactions::decode_for(state, self.subtask)?;
        for id in &listed {
            self.commit_one(*id)?;
        }
        let owner = Arc::clone(&self.owner);
        let orphans = self
            .worker
            .call(move |session| server::prepared_checkpoints(session, &owner))?;
        for orphan in orphans.into_iter().filter(|id| !listed.contains(id)) {
            let owner = Arc::clone(&self.owner);
            self.worker.call(move |session| {
                server::finish_prepared(session, &owner, "ROLLBACK", orphan).map(|_| ())
            })?;
            tracing::info!(
                subtask = self.subtask,
                checkpoint = orphan,
                "rolled back an orphan prepared transaction"
            );
        }
        self.buffer.clear();
        self.open = false;
        self.pending.clear();
        Ok(())
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        let listed = PendingTransactions::decode_for(state, self.subtask)?;
        let (owner, mode, subtask) = (Arc::clone(&self.owner), self.config.mode, self.subtask);
        self.worker.call(move |session| {
            let prepared = server::prepared_checkpoints(session, &owner)?;
            for id in listed {
                if !prepared.contains(&id) && !server::is_committed(session, &owner, id)? {
                    return Ok(Err(SinkError::StagedDataDamaged {
                        subtask,
                        checkpoint_id: id,
                        location: owner.ids.id(id),
                        reason: "the prepared transaction is gone and its commit is not recorded"
                            .to_string(),
                    }));
                }
            }
            Ok(Ok(match mode {
                Mode::ExactlyOnce => {
                    Visibility::Known(server::committed_after(session, &owner, restored)?)
                }
                Mode::Idempotent => Visibility::ReplayIsHarmless,
            }))
        })?
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.finished = true;
        self.flush()
    }

    fn bytes_written(&self) -> Option<u64> {
        Some(self.bytes_written)
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::ExactlyOnce
    }
}
