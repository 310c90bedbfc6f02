//! The optional HTTP server of a running job (cargo feature `http`):
//! Prometheus text at `/metrics`, a small JSON API under `/api/`, the
//! actions savepoint, stop with a savepoint and cancel (off unless
//! enabled), and the web dashboard at `/`.
//!
//! It owns one thread that answers requests one at a time from the job's
//! [`MetricsRegistry`] snapshots, so a slow or hostile client never
//! delays an actor: it reads what the actors publish and never runs on
//! their threads. It never decides anything about the job: an action is
//! handed to the job as a request, as [`RunningJob`](crate::job::RunningJob)'s
//! methods would make it.
//!
//! Routes (`GET` unless said):
//!
//! | path | answer |
//! |---|---|
//! | `/` | the dashboard (one HTML page with its script, no network) |
//! | `/metrics` | Prometheus / OpenMetrics text |
//! | `/api/job` | the job graph: operators with kind and parallelism, edges |
//! | `/api/metrics` | the whole [`JobMetrics`](crate::metrics::JobMetrics) |
//! | `/api/operators` | per-operator and per-subtask figures |
//! | `/api/checkpoints` | counts and the checkpoint history |
//! | `/api/failure` | the last failure and the restarts |
//! | `POST /api/savepoint`, `/api/stop`, `/api/cancel` | 202, or 403 unless actions are enabled |

mod api;
mod dashboard;
mod prometheus;

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;

use crate::metrics::MetricsRegistry;

pub use api::Action;
pub use prometheus::render as render_prometheus;

/// What the server may do to the job, given by the job when it starts it.
pub type ActionHandler = Arc<dyn Fn(Action) + Send + Sync>;

/// A running HTTP server; it stops when dropped.
pub struct HttpServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<thread::JoinHandle<()>>,
}

impl fmt::Debug for HttpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl HttpServer {
    /// Serves `registry` on `addr` (port 0: any free port). `actions` is
    /// `None` unless the job enabled them; the action routes answer 403
    /// then.
    ///
    /// # Errors
    ///
    /// The address cannot be bound, as text.
    pub fn start(
        addr: SocketAddr,
        registry: Arc<MetricsRegistry>,
        actions: Option<ActionHandler>,
    ) -> Result<HttpServer, String> {
        let server = tiny_http::Server::http(addr)
            .map_err(|error| format!("cannot serve HTTP on {addr}: {error}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("HTTP on {addr} is not an IP address"))?;
        let server = Arc::new(server);
        let thread = thread::Builder::new()
            .name("snapflow-http".into())
            .spawn({
                let server = Arc::clone(&server);
                move || {
                    // Ends when `unblock` is called at drop.
                    for request in server.incoming_requests() {
                        api::answer(request, &registry, actions.as_ref());
                    }
                }
            })
            .map_err(|error| format!("cannot start the HTTP thread: {error}"))?;
        tracing::info!(%addr, "serving metrics and the dashboard over HTTP");
        Ok(HttpServer {
            server,
            addr,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port chosen when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            // A panic in a handler ended only the server; nothing to add.
            let _ = thread.join();
        }
    }
}
