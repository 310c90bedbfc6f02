//! The PostgreSQL connector's error type and its mapping onto
//! [`SinkError`].
//!
//! This module owns one question: whether a failure can go away by
//! itself (a lost connection, a server shutting down, a lock that timed
//! out) or cannot (wrong SQL, a constraint violation, a wrong password, a
//! server setting). It never retries anything itself; the job's restart
//! strategy does, for retryable errors only.

use crate::sink::{ConnectorError, SinkError};

use postgres::error::SqlState;

/// Why a PostgreSQL sink call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// Connecting to the server failed (unreachable, refused, wrong
    /// password, unknown database).
    #[error("connecting to PostgreSQL failed: {}", describe(source))]
    Connect {
        /// The client's error.
        #[source]
        source: postgres::Error,
    },
    /// A statement failed.
    #[error("PostgreSQL failed while {operation}: {}", describe(source))]
    Sql {
        /// What the sink was doing, e.g. "preparing transaction `...`".
        operation: String,
        /// The client's error (with the server's SQLSTATE, if any).
        #[source]
        source: postgres::Error,
    },
    /// Exactly-once mode needs prepared transactions, which the server
    /// has turned off.
    #[error(
        "PostgreSQL has max_prepared_transactions = {found}, so PREPARE TRANSACTION is \
         disabled and the exactly-once sink cannot run. Fix: set max_prepared_transactions \
         to at least the number of sink subtasks times the checkpoints in flight (e.g. \
         `max_prepared_transactions = 64` in postgresql.conf, or `-c \
         max_prepared_transactions=64` on the server's command line) and restart the \
         server, or use the idempotent mode (`Mode::Idempotent`) with an upsert statement"
    )]
    PreparedTransactionsDisabled {
        /// The setting the server reported.
        found: String,
    },
    /// A name (job, operator, table) the sink cannot use in transaction
    /// ids or SQL.
    #[error("invalid PostgreSQL sink name `{name}`: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A row gave another number of parameters than the multi-row
    /// statement has per row.
    #[error(
        "a row gave {found} parameters, but the multi-row insert takes {expected} per row \
         (the record-to-parameters function and `MultiRowInsert::new` disagree)"
    )]
    RowWidth {
        /// Parameters per row of the statement.
        expected: usize,
        /// Parameters the row gave.
        found: usize,
    },
    /// The sink's connection thread is gone (it panicked or could not be
    /// started), or did not answer within the configured bound.
    #[error("the PostgreSQL sink's connection thread {reason}")]
    Worker {
        /// What happened to it.
        reason: String,
    },
}

impl PostgresError {
    /// Whether the same call may succeed later: a lost connection, a
    /// server shutting down or starting, a lock or statement timeout, a
    /// serialization failure or deadlock. Wrong SQL, constraint
    /// violations, authentication and server settings are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            PostgresError::Connect { source } | PostgresError::Sql { source, .. } => {
                is_transient(source)
            }
            PostgresError::Worker { .. } => true,
            PostgresError::PreparedTransactionsDisabled { .. }
            | PostgresError::InvalidName { .. }
            | PostgresError::RowWidth { .. } => false,
        }
    }

    /// The error as a [`SinkError`] the job understands: this error kept
    /// whole in [`SinkError::Connector`] (reach it with
    /// [`ConnectorError::downcast_ref`]), with its retryability.
    pub fn into_sink_error(self) -> SinkError {
        let retryable = self.is_retryable();
        SinkError::Connector(ConnectorError::new(self, retryable))
    }
}

impl From<PostgresError> for SinkError {
    fn from(error: PostgresError) -> SinkError {
        error.into_sink_error()
    }
}

/// A client error with the server's message, SQLSTATE and detail: the
/// client's own `Display` says only "db error" for a server error.
fn describe(error: &postgres::Error) -> String {
    let Some(db) = error.as_db_error() else {
        return error.to_string();
    };
    let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
    if let Some(detail) = db.detail() {
        text.push_str(": ");
        text.push_str(detail);
    }
    text
}

/// Whether a client error can go away by itself.
fn is_transient(error: &postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    if let Some(code) = error.code() {
        return is_transient_code(code);
    }
    // No SQLSTATE: either the socket failed (an I/O error is the source,
    // which is what a lost or refused connection looks like; so is the
    // client's own connect timeout, which has no source and says
    // "timeout"), or the client refused the call itself (a wrong number
    // or type of parameters), which no retry fixes.
    let io_failure =
        std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>());
    io_failure || error.to_string().starts_with("timeout")
}

/// The SQLSTATEs of failures that a retry after a restart can get past.
fn is_transient_code(code: &SqlState) -> bool {
    // Class 08: connection exceptions.
    code.code().starts_with("08")
        || [
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::QUERY_CANCELED,
            SqlState::TOO_MANY_CONNECTIONS,
        ]
        .contains(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_and_shutdown_codes_are_transient_and_constraints_are_not() {
        assert!(is_transient_code(&SqlState::CONNECTION_FAILURE));
        assert!(is_transient_code(&SqlState::ADMIN_SHUTDOWN));
        assert!(is_transient_code(&SqlState::LOCK_NOT_AVAILABLE));
        assert!(!is_transient_code(&SqlState::UNIQUE_VIOLATION));
        assert!(!is_transient_code(&SqlState::SYNTAX_ERROR));
        assert!(!is_transient_code(&SqlState::INVALID_PASSWORD));
    }

    #[test]
    fn a_disabled_server_setting_is_not_retryable_and_says_how_to_fix_it() {
        let error = PostgresError::PreparedTransactionsDisabled {
            found: "0".to_string(),
        };
        assert!(!error.is_retryable());
        assert!(error.to_string().contains("max_prepared_transactions"));
        let sink_error = error.into_sink_error();
        assert!(!sink_error.is_retryable());
        let SinkError::Connector(connector) = &sink_error else {
            panic!("not a connector error: {sink_error:?}");
        };
        assert!(matches!(
            connector.downcast_ref::<PostgresError>(),
            Some(PostgresError::PreparedTransactionsDisabled { .. })
        ));
        assert!(sink_error.to_string().contains("max_prepared_transactions"));
    }
}
