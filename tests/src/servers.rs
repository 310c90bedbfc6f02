//! What the tests that need a server share: finding it through an
//! environment variable (skip with a message outside CI, fail in CI,
//! where `.ci/run` starts every server), and names that no other test or
//! run uses (a developer's server outlives a test run).
//!
//! It knows no server: each test suite passes its variable and script.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// The value of `var`, or `None` (with a message saying how to start the
/// server with `script`) when it is not set outside CI. In CI
/// (`CI=true`) a missing server fails the test: CI must run every one.
pub fn server_from_env(var: &str, what: &str, script: &str) -> Option<String> {
    if let Ok(value) = std::env::var(var) {
        if !value.is_empty() {
            return Some(value);
        }
    }
    let ci = std::env::var("CI").is_ok_and(|value| value == "true");
    assert!(
        !ci,
        "{var} is not set, and CI must not skip the {what} tests: .ci/run starts the server"
    );
    eprintln!(
        "skipped: {var} is not set; start one with `eval \"$({script} start)\"` \
         (stop it with `{script} stop`)"
    );
    None
}

/// `what`, the process id, the time's nanoseconds and a counter, joined
/// by `separator` (`_` for SQL names, `-` for Kafka topics).
pub fn unique_name(what: &str, separator: char) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.subsec_nanos());
    let count = NEXT.fetch_add(1, Ordering::SeqCst);
    let id = std::process::id();
    format!("{what}{separator}{id}{separator}{nanos}{separator}{count}")
}
