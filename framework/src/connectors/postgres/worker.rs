//! The thread each PostgreSQL sink owns: the blocking client lives and
//! runs there, never on the caller's thread.
//!
//! The blocking `postgres` client runs its own tokio runtime and panics
//! when it is called on a thread that already runs one; an actix arbiter,
//! where a sink's calls arrive, is such a thread. So every client call is
//! a closure sent to this thread over a channel that holds at most one
//! command, and the caller waits for its answer: one command in flight
//! per sink, so nothing queues up.
//!
//! This module owns the thread, the connections and the prepared
//! statements. It never decides what to send; the sink does.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls, Statement};

use super::config::PostgresConfig;
use super::error::PostgresError;

/// Commands waiting for the thread: one, because every caller waits for
/// its answer before it sends the next.
const COMMAND_QUEUE: usize = 1;
/// Extra time, past the connect timeout, to wait for the thread to say
/// whether it connected (it also has to start and set the session up).
const START_GRACE: Duration = Duration::from_secs(5);
/// The pause between two connection attempts while the server refuses.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// A connection and what this sink prepared on it.
pub(crate) struct Session {
    /// The data connection: the open transaction of the current
    /// checkpoint interval, the user's statement, `PREPARE TRANSACTION`.
    pub(crate) client: Client,
    /// The control connection, never inside a transaction block:
    /// `COMMIT PREPARED`, `ROLLBACK PREPARED` and bookkeeping reads.
    pub(crate) control: Client,
    /// The user's statements prepared on the data connection, newest
    /// last; at most [`PREPARED_KEPT`].
    prepared: Vec<(String, Statement)>,
}

/// Prepared statements kept per connection: the per-row statement, or a
/// multi-row insert's full chunk and a few sizes of the last chunk of a
/// batch. Older ones are dropped (the client closes them on the server).
const PREPARED_KEPT: usize = 4;

impl Session {
    /// The prepared form of `sql`, preparing it at the first use.
    pub(crate) fn statement(&mut self, sql: &str) -> Result<Statement, PostgresError> {
        if let Some((_, statement)) = self.prepared.iter().find(|(text, _)| text == sql) {
            return Ok(statement.clone());
        }
        let statement = self
            .client
            .prepare(sql)
            .map_err(sql_error(format!("preparing `{}`", abbreviated(sql))))?;
        if self.prepared.len() == PREPARED_KEPT {
            self.prepared.remove(0);
        }
        self.prepared.push((sql.to_string(), statement.clone()));
        Ok(statement)
    }
}

/// `sql` cut to its first 200 characters, for error messages: a
/// multi-row insert's text runs to many kilobytes.
pub(crate) fn abbreviated(sql: &str) -> String {
    const SHOWN_CHARS: usize = 200;
    match sql.char_indices().nth(SHOWN_CHARS) {
        Some((end, _)) => format!("{} ...", &sql[..end]),
        None => sql.to_string(),
    }
}

type Command = Box<dyn FnOnce(&mut Session) + Send>;

/// The handle to a sink's connection thread. Dropping it ends the thread
/// once its current command (if any) is done; the server then rolls back
/// any open, unprepared transaction of the connection.
pub(crate) struct Worker {
    commands: SyncSender<Command>,
}

impl Worker {
    /// Starts a thread named `name` and connects on it.
    ///
    /// # Errors
    ///
    /// [`PostgresError::Connect`] when the server cannot be reached or
    /// refuses the connection; [`PostgresError::Worker`] when the thread
    /// cannot start or does not answer in time.
    pub(crate) fn connect(config: &PostgresConfig, name: String) -> Result<Worker, PostgresError> {
        let (commands, receiver) = mpsc::sync_channel::<Command>(COMMAND_QUEUE);
        let (ready, started) = mpsc::sync_channel(1);
        let limit = config.connect_timeout + config.connect_retry + START_GRACE;
        let config = config.clone();
        thread::Builder::new()
            .name(name)
            .spawn(move || match open_session(&config) {
                Ok(session) => {
                    let _ = ready.send(Ok(()));
                    serve(session, receiver);
                }
                Err(error) => {
                    let _ = ready.send(Err(error));
                }
            })
            .map_err(|error| PostgresError::Worker {
                reason: format!("could not start: {error}"),
            })?;
        match started.recv_timeout(limit) {
            Ok(Ok(())) => Ok(Worker { commands }),
            Ok(Err(error)) => Err(error),
            Err(RecvTimeoutError::Timeout) => Err(PostgresError::Worker {
                reason: format!("did not connect within {limit:?}"),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(PostgresError::Worker {
                reason: "ended while connecting (it panicked)".to_string(),
            }),
        }
    }

    /// Runs `call` on the thread and waits for its answer.
    ///
    /// The wait has no clock of its own: a statement waiting for a row
    /// lock is bounded by the session's `lock_timeout`, and a dead peer by
    /// the connection (a closed socket fails the call at once).
    ///
    /// # Errors
    ///
    /// `call`'s error, or [`PostgresError::Worker`] (retryable) when the
    /// thread is gone or ended without answering.
    pub(crate) fn call<R, F>(&self, call: F) -> Result<R, PostgresError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Session) -> Result<R, PostgresError> + Send + 'static,
    {
        let (answer, answered) = mpsc::sync_channel(1);
        let command: Command = Box::new(move |session| {
            let _ = answer.send(call(session));
        });
        self.commands
            .send(command)
            .map_err(|_| PostgresError::Worker {
                reason: "is gone (it panicked earlier)".to_string(),
            })?;
        answered.recv().map_err(|_| PostgresError::Worker {
            reason: "ended without answering (it panicked)".to_string(),
        })?
    }
}

/// Opens a session, trying again every [`RETRY_PAUSE`] for at most
/// `connect_retry` while the attempts fail with a retryable error.
fn open_session(config: &PostgresConfig) -> Result<Session, PostgresError> {
    let deadline = Instant::now() + config.connect_retry;
    loop {
        match try_open_session(config) {
            Err(error) if error.is_retryable() && Instant::now() + RETRY_PAUSE < deadline => {
                thread::sleep(RETRY_PAUSE);
            }
            outcome => return outcome,
        }
    }
}

/// Opens both connections of a session.
fn try_open_session(config: &PostgresConfig) -> Result<Session, PostgresError> {
    Ok(Session {
        client: open_connection(config)?,
        control: open_connection(config)?,
        prepared: Vec::with_capacity(PREPARED_KEPT),
    })
}

/// Connects and sets the connection up: `lock_timeout` bounds every wait
/// for a row lock.
fn open_connection(config: &PostgresConfig) -> Result<Client, PostgresError> {
    let mut client_config: postgres::Config = config
        .url
        .parse()
        .map_err(|source| PostgresError::Connect { source })?;
    client_config.connect_timeout(config.connect_timeout);
    let mut client = client_config
        .connect(NoTls)
        .map_err(|source| PostgresError::Connect { source })?;
    let lock_timeout_ms = config.lock_timeout.as_millis().max(1);
    client
        .batch_execute(&format!("SET lock_timeout = {lock_timeout_ms}"))
        .map_err(sql_error("setting lock_timeout".to_string()))?;
    Ok(client)
}

/// Runs commands until the handle is dropped.
fn serve(mut session: Session, commands: Receiver<Command>) {
    while let Ok(command) = commands.recv() {
        command(&mut session);
    }
}

/// Wraps a client error with what the sink was doing.
pub(crate) fn sql_error(operation: String) -> impl FnOnce(postgres::Error) -> PostgresError {
    move |source| PostgresError::Sql { operation, source }
}
