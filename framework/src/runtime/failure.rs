//! Failure reports: what went wrong in which actor instance, and where the
//! report goes.
//!
//! This module owns the typed [`FailureReport`], the [`FailureSink`] reports
//! are sent to, and [`guard`], the `catch_unwind` wrapper every user callback
//! runs in. actix 0.13.5 does not catch panics: a panicking handler kills only
//! its actor and silently loses the actor's mailbox, so without this module a
//! failure would look like a hang. This module never restarts or stops
//! anything itself; the caller stops the failed actor and a supervisor decides
//! what to do with the report.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use actix::{Message, Recipient};

use super::{ActorTag, BoxError};

/// Where in an actor's life a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// A user callback panicked and the panic was caught by [`guard`].
    CallbackPanicked,
    /// A user callback returned an error.
    CallbackFailed,
    /// The function that builds the actor on its arbiter panicked.
    ConstructorPanicked,
    /// The actor's task ended with a panic that no [`guard`] caught (a panic
    /// in runtime code or in a handler that runs user code unguarded). The
    /// watcher task reported it; the actor's mailbox is lost.
    ActorTaskPanicked,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            FailureKind::CallbackPanicked => "callback panicked",
            FailureKind::CallbackFailed => "callback failed",
            FailureKind::ConstructorPanicked => "constructor panicked",
            FailureKind::ActorTaskPanicked => "actor task panicked",
        };
        f.write_str(text)
    }
}

/// One failure of one actor instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureReport {
    /// The failed actor instance (operator name, subtask, generation).
    pub tag: ActorTag,
    /// Where the failure happened.
    pub kind: FailureKind,
    /// The panic message or the error's text.
    pub message: String,
    /// Whether running the failed code again may succeed. False for an
    /// error that says so (see [`is_retryable_error`]): the job then ends
    /// at once instead of restarting. Panics count as retryable; a panic
    /// that repeats ends the job through the restart strategy's bound.
    pub retryable: bool,
}

impl Message for FailureReport {
    type Result = ();
}

impl fmt::Display for FailureReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.tag, self.kind, self.message)
    }
}

/// Where failure reports go: an actix recipient (a supervisor actor) or any
/// thread-safe callback. Cloning is cheap.
#[derive(Clone)]
pub struct FailureSink {
    deliver: Arc<dyn Fn(FailureReport) + Send + Sync>,
}

impl FailureSink {
    /// A sink that calls `deliver` for every report, on the failing actor's
    /// thread. `deliver` must not block for long.
    pub fn from_fn(deliver: impl Fn(FailureReport) + Send + Sync + 'static) -> Self {
        Self {
            deliver: Arc::new(deliver),
        }
    }

    /// A sink that sends every report to an actor with `do_send`.
    ///
    /// A report to an actor that has stopped is lost; it is also logged, so it
    /// is never lost silently.
    pub fn from_recipient(recipient: Recipient<FailureReport>) -> Self {
        Self::from_fn(move |report| recipient.do_send(report))
    }

    /// A sink that only logs. Useful where nobody supervises (benchmarks).
    pub fn log_only() -> Self {
        Self::from_fn(|_| {})
    }

    /// Logs the report and hands it to the sink.
    pub fn report(&self, report: FailureReport) {
        tracing::error!(
            operator = %report.tag.operator,
            subtask = report.tag.subtask,
            generation = report.tag.generation.0,
            kind = %report.kind,
            "{}",
            report.message
        );
        (self.deliver)(report);
    }
}

impl fmt::Debug for FailureSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FailureSink")
    }
}

/// Runs a user callback, catching a panic or an error and reporting it.
///
/// Returns `Some(value)` on success and `None` after a failure was reported;
/// the caller must then stop the actor, because its state may be
/// half-updated. `AssertUnwindSafe` is sound here for that reason: nothing
/// the callback touched is used again after a panic, except to drop it.
pub fn guard<R>(
    tag: &ActorTag,
    sink: &FailureSink,
    callback: impl FnOnce() -> Result<R, BoxError>,
) -> Option<R> {
    match catch_unwind(AssertUnwindSafe(callback)) {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            sink.report(FailureReport {
                tag: tag.clone(),
                kind: FailureKind::CallbackFailed,
                message: error.to_string(),
                retryable: is_retryable_error(error.as_ref()),
            });
            None
        }
        Err(payload) => {
            sink.report(FailureReport {
                tag: tag.clone(),
                kind: FailureKind::CallbackPanicked,
                message: panic_message(payload.as_ref()),
                retryable: true,
            });
            None
        }
    }
}

/// Whether retrying may fix `error`: its own `is_retryable` when it (or an
/// error in its `source()` chain, first found wins) is one of snapflow's
/// typed errors, false for [`NotRetryable`] and for bytes that do not
/// decode (`postcard::Error`: a stored part that passed its checksum but
/// not its decoder will fail the same way every time), and true for
/// anything else (a user's error, of which nothing is known).
pub fn is_retryable_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(answer) = typed_retryable(error) {
            return answer;
        }
        current = error.source();
    }
    true
}

fn typed_retryable(error: &(dyn std::error::Error + 'static)) -> Option<bool> {
    if error.is::<NotRetryable>() || error.is::<postcard::Error>() {
        return Some(false);
    }
    if let Some(error) = error.downcast_ref::<crate::sink::SinkError>() {
        return Some(error.is_retryable());
    }
    if let Some(error) = error.downcast_ref::<crate::source::SourceError>() {
        return Some(error.is_retryable());
    }
    if let Some(error) = error.downcast_ref::<crate::state::StateError>() {
        return Some(error.is_retryable());
    }
    if let Some(error) = error.downcast_ref::<crate::keyed::KeyedError>() {
        return Some(error.is_retryable());
    }
    if let Some(error) = error.downcast_ref::<crate::storage::StoreError>() {
        return Some(error.is_retryable());
    }
    None
}

/// Marks a user's error as one that retrying cannot fix: returned from a
/// process function, an operator, a source or a sink, it ends the job at
/// once with [`JobError::NotRetryable`](crate::job::JobError::NotRetryable)
/// instead of restarting it.
///
/// ```
/// use snapflow::runtime::{is_retryable_error, NotRetryable};
///
/// let error = NotRetryable::new("record 17 has no user id");
/// assert!(!is_retryable_error(&error));
/// assert_eq!(error.to_string(), "record 17 has no user id");
/// ```
#[derive(Debug)]
pub struct NotRetryable {
    message: String,
    source: Option<BoxError>,
}

impl NotRetryable {
    /// An error with this message.
    pub fn new(message: impl Into<String>) -> NotRetryable {
        NotRetryable {
            message: message.into(),
            source: None,
        }
    }

    /// Wraps `error`, keeping it as the source.
    pub fn wrap(error: impl Into<BoxError>) -> NotRetryable {
        let source = error.into();
        NotRetryable {
            message: source.to_string(),
            source: Some(source),
        }
    }
}

impl fmt::Display for NotRetryable {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.message)
    }
}

impl std::error::Error for NotRetryable {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|error| error as &(dyn std::error::Error + 'static))
    }
}

/// Extracts the text of a panic payload (`panic!` with a literal gives a
/// `&str`, with format arguments a `String`; anything else has no text).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&'static str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic with a non-string payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Generation;
    use std::sync::Mutex;

    fn collecting_sink() -> (FailureSink, Arc<Mutex<Vec<FailureReport>>>) {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let store = Arc::clone(&reports);
        let sink = FailureSink::from_fn(move |report| store.lock().unwrap().push(report));
        (sink, reports)
    }

    fn check(
        callback: impl FnOnce() -> Result<u32, BoxError>,
        expected: Option<(FailureKind, &str)>,
    ) {
        let tag = ActorTag::new("op", 3, Generation(7));
        let (sink, reports) = collecting_sink();
        let result = guard(&tag, &sink, callback);
        let reports = reports.lock().unwrap();
        match expected {
            None => {
                assert_eq!(result, Some(1));
                assert!(reports.is_empty());
            }
            Some((kind, message)) => {
                assert_eq!(result, None);
                assert_eq!(reports.len(), 1);
                assert_eq!(reports[0].tag, tag);
                assert_eq!(reports[0].kind, kind);
                assert_eq!(reports[0].message, message);
            }
        }
    }

    #[test]
    fn success_passes_through() {
        check(|| Ok(1), None);
    }

    #[test]
    fn literal_panic_is_reported() {
        check(
            || panic!("boom"),
            Some((FailureKind::CallbackPanicked, "boom")),
        );
    }

    #[test]
    fn formatted_panic_is_reported() {
        check(
            || panic!("boom {}", 42),
            Some((FailureKind::CallbackPanicked, "boom 42")),
        );
    }

    #[test]
    fn non_string_panic_is_reported() {
        check(
            || std::panic::panic_any(5_u8),
            Some((
                FailureKind::CallbackPanicked,
                "panic with a non-string payload",
            )),
        );
    }

    #[test]
    fn error_is_reported() {
        check(
            || Err("bad record".into()),
            Some((FailureKind::CallbackFailed, "bad record")),
        );
    }
}
