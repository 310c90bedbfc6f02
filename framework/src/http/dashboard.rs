//! The web dashboard: one static HTML page with its script and styles,
//! embedded in the binary, that polls `/api/metrics` and draws the job
//! graph, the checkpoint history and its chart, restarts and watermarks.
//! It loads nothing from the network.

/// The page served at `/`.
pub(super) const PAGE: &str = include_str!("dashboard.html");
