//! [`ConnectorError`]: a connector's own error carried inside a
//! [`SinkError`](super::SinkError), so that a caller can still reach it
//! (its type, its SQLSTATE, its source chain) after the job layer has seen
//! only a `SinkError`.
//!
//! This module owns the wrapping and the retryability the connector gave;
//! it never inspects the wrapped error to decide anything.

use std::error::Error;
use std::fmt;

/// A connector's error with whether retrying can fix it, as the
/// connector judged. It shows as the wrapped error (its message, and its
/// source as this error's source), so wrapping changes no message.
///
/// ```
/// use snapflow::sink::{ConnectorError, SinkError};
///
/// let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
/// let error = SinkError::Connector(ConnectorError::new(io, true));
/// assert!(error.is_retryable());
/// assert_eq!(error.to_string(), "reset by peer");
/// let SinkError::Connector(connector) = &error else { unreachable!() };
/// assert!(connector.downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Debug)]
pub struct ConnectorError {
    error: Box<dyn Error + Send + Sync + 'static>,
    retryable: bool,
}

impl ConnectorError {
    /// Wraps `error`; `retryable` says whether the same call may succeed
    /// later.
    pub fn new(error: impl Into<Box<dyn Error + Send + Sync + 'static>>, retryable: bool) -> Self {
        ConnectorError {
            error: error.into(),
            retryable,
        }
    }

    /// Whether the same call may succeed later, as the connector said.
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The wrapped error.
    pub fn get_ref(&self) -> &(dyn Error + Send + Sync + 'static) {
        self.error.as_ref()
    }

    /// The wrapped error as `E`, if it is one.
    pub fn downcast_ref<E: Error + 'static>(&self) -> Option<&E> {
        self.error.downcast_ref::<E>()
    }
}

impl fmt::Display for ConnectorError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, formatter)
    }
}

impl Error for ConnectorError {
    // The wrapped error's own source, not the wrapped error itself: its
    // message is already this error's message, and a chain printer would
    // show it twice.
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}
