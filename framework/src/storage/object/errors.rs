//! What an object store's error means for the checkpoint store: the
//! classification of [`object_store::Error`] into an `io::Error` the
//! engine understands (absent objects as `NotFound`) or a typed
//! [`StoreError::ObjectStore`] that says what to fix and whether a retry
//! helps. It never retries and never decides what to do next.

use std::error::Error as _;
use std::io;

use crate::storage::{ObjectStoreProblem, StoreError};

/// Words in a server's answer that mean the credentials were refused.
const CREDENTIAL_WORDS: [&str; 5] = [
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "InvalidToken",
    "ExpiredToken",
];
/// Words in a client's error that mean no answer came at all.
const UNREACHABLE_WORDS: [&str; 6] = [
    "error sending request",
    "Connection refused",
    "connection refused",
    "dns error",
    "timed out",
    "error trying to connect",
];

/// The error and all its sources, as one line.
fn full_text(error: &object_store::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

/// What `error`, of a request for `location`, is.
pub(crate) fn problem_of(error: &object_store::Error, text: &str) -> Option<ObjectStoreProblem> {
    if text.contains("NoSuchBucket") {
        return Some(ObjectStoreProblem::NoSuchBucket);
    }
    match error {
        object_store::Error::NotFound { .. } => None,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => Some(ObjectStoreProblem::BadCredentials),
        object_store::Error::NotImplemented | object_store::Error::NotSupported { .. } => {
            Some(ObjectStoreProblem::Unsupported)
        }
        _ if CREDENTIAL_WORDS.iter().any(|word| text.contains(word)) => {
            Some(ObjectStoreProblem::BadCredentials)
        }
        _ if UNREACHABLE_WORDS.iter().any(|word| text.contains(word)) => {
            Some(ObjectStoreProblem::Unreachable)
        }
        _ => Some(ObjectStoreProblem::Request),
    }
}

/// `error` of a request for `location` as the engine's `io::Error`: an
/// absent object as `NotFound`, anything else carrying a typed
/// [`StoreError::ObjectStore`].
pub(crate) fn classify(location: &str, error: object_store::Error) -> io::Error {
    let text = full_text(&error);
    match problem_of(&error, &text) {
        None => io::Error::new(io::ErrorKind::NotFound, text),
        Some(problem) => StoreError::ObjectStore {
            location: location.to_string(),
            problem,
            detail: text,
        }
        .into_io(),
    }
}

#[cfg(test)]
mod tests {
    use super::problem_of;
    use crate::storage::ObjectStoreProblem;

    fn generic(message: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: message.to_string().into(),
        }
    }

    /// The server's words decide, whatever variant carries them.
    #[test]
    fn words_decide_the_problem() {
        for (message, problem) in [
            (
                "<Code>NoSuchBucket</Code>",
                ObjectStoreProblem::NoSuchBucket,
            ),
            (
                "<Code>InvalidAccessKeyId</Code>",
                ObjectStoreProblem::BadCredentials,
            ),
            (
                "error sending request for url",
                ObjectStoreProblem::Unreachable,
            ),
            ("500 Internal Server Error", ObjectStoreProblem::Request),
        ] {
            assert_eq!(
                problem_of(&generic(message), message),
                Some(problem),
                "{message}"
            );
        }
    }
}
