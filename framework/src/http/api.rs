//! The routes of the HTTP server: one request in, one response out, from
//! a fresh metrics snapshot. No state between requests.

use std::io::Cursor;

use serde::Serialize;
use tiny_http::{Header, Method, Request, Response};

use super::{dashboard, prometheus, ActionHandler};
use crate::metrics::{JobMetrics, MetricsRegistry};

/// An action a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Take a savepoint and keep running.
    Savepoint,
    /// Take a savepoint and stop.
    StopWithSavepoint,
    /// Stop at once, without a savepoint.
    Cancel,
}

type Answer = Response<Cursor<Vec<u8>>>;

fn body(status: u16, content_type: &str, bytes: Vec<u8>) -> Answer {
    let mut response = Response::from_data(bytes).with_status_code(status);
    for (name, value) in [
        ("Content-Type", content_type),
        ("Cache-Control", "no-store"),
    ] {
        // Both are ASCII constants of this module, so this always holds.
        if let Ok(header) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            response.add_header(header);
        }
    }
    response
}

fn json<T: Serialize>(status: u16, value: &T) -> Answer {
    match serde_json::to_vec(value) {
        Ok(bytes) => body(status, "application/json", bytes),
        Err(error) => body(
            500,
            "text/plain; charset=utf-8",
            format!("cannot encode the answer: {error}").into_bytes(),
        ),
    }
}

#[derive(Serialize)]
struct Message<'a> {
    error: Option<&'a str>,
    requested: Option<Action>,
}

fn error(status: u16, text: &str) -> Answer {
    json(
        status,
        &Message {
            error: Some(text),
            requested: None,
        },
    )
}

#[derive(Serialize)]
struct GraphOperator<'a> {
    name: &'a str,
    kind: crate::metrics::OperatorKind,
    parallelism: usize,
}

#[derive(Serialize)]
struct Graph<'a> {
    job: &'a str,
    uptime_ms: u64,
    operators: Vec<GraphOperator<'a>>,
    edges: &'a [crate::metrics::EdgeMetrics],
}

#[derive(Serialize)]
struct Checkpoints<'a> {
    completed: u64,
    failed: u64,
    history: &'a [crate::metrics::CheckpointMetrics],
}

#[derive(Serialize)]
struct Failures<'a> {
    last_failure: Option<&'a str>,
    restarts_total: u64,
    restarts: &'a [crate::metrics::RestartMetrics],
}

fn graph(metrics: &JobMetrics) -> Answer {
    json(
        200,
        &Graph {
            job: &metrics.job,
            uptime_ms: metrics.uptime_ms,
            operators: metrics
                .operators
                .iter()
                .map(|operator| GraphOperator {
                    name: &operator.name,
                    kind: operator.kind,
                    parallelism: operator.parallelism,
                })
                .collect(),
            edges: &metrics.edges,
        },
    )
}

fn route_get(path: &str, registry: &MetricsRegistry) -> Answer {
    match path {
        "/" | "/index.html" => body(200, "text/html; charset=utf-8", dashboard::PAGE.into()),
        "/metrics" => body(
            200,
            prometheus::CONTENT_TYPE,
            prometheus::render(&registry.snapshot()).into_bytes(),
        ),
        "/api/job" => graph(&registry.snapshot()),
        "/api/metrics" => json(200, &registry.snapshot()),
        "/api/operators" => json(200, &registry.snapshot().operators),
        "/api/checkpoints" => {
            let metrics = registry.snapshot();
            json(
                200,
                &Checkpoints {
                    completed: metrics.checkpoints_completed,
                    failed: metrics.checkpoints_failed,
                    history: &metrics.checkpoints,
                },
            )
        }
        "/api/failure" => {
            let metrics = registry.snapshot();
            json(
                200,
                &Failures {
                    last_failure: metrics.last_failure.as_deref(),
                    restarts_total: metrics.restarts_total,
                    restarts: &metrics.restarts,
                },
            )
        }
        _ => error(404, "no such page"),
    }
}

fn route_post(path: &str, actions: Option<&ActionHandler>) -> Answer {
    let action = match path {
        "/api/savepoint" => Action::Savepoint,
        "/api/stop" => Action::StopWithSavepoint,
        "/api/cancel" => Action::Cancel,
        _ => return error(404, "no such action"),
    };
    let Some(actions) = actions else {
        return error(
            403,
            "actions are disabled; enable them with JobConfig::http_actions",
        );
    };
    actions(action);
    json(
        202,
        &Message {
            error: None,
            requested: Some(action),
        },
    )
}

/// Answers one request. A client that went away is not an error of the
/// job, so a failed write is only logged at debug level.
pub(super) fn answer(
    request: Request,
    registry: &MetricsRegistry,
    actions: Option<&ActionHandler>,
) {
    // The query string plays no part in any route.
    let path = request.url().split('?').next().unwrap_or("/").to_owned();
    let response = match request.method() {
        Method::Get | Method::Head => route_get(&path, registry),
        Method::Post => route_post(&path, actions),
        _ => error(405, "only GET and POST are served"),
    };
    if let Err(error) = request.respond(response) {
        tracing::debug!(%error, path, "an HTTP answer was not delivered");
    }
}
