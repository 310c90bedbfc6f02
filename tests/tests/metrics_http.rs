//! The job's HTTP server (feature `http`): the JSON API shows the graph,
//! the metrics, the checkpoints and the failures of a running job; the
//! Prometheus exposition parses with a Prometheus text parser and carries
//! the counts; the actions are refused unless enabled, and when enabled a
//! savepoint lands in the store, stop ends the job with a savepoint and
//! cancel cancels it. Without configuration there is no server, and the
//! default address is loopback with the actions off.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use snapflow::job::{Job, JobConfig, JobError, RunningJob};
use snapflow::sink::CollectHandle;
use snapflow::storage::{CheckpointKind, CheckpointStore, FsCheckpointStore};
use snapflow_tests::slow_commit::SlowCommits;
use snapflow_tests::tenths;

/// numbers → tenths → keyed count → a sink that sleeps 2 ms per batch of
/// 4 records (8,000 records: about 4 s at parallelism 2), with
/// checkpoints every 50 ms into `root`.
fn start(root: &std::path::Path, actions: bool) -> (RunningJob, String) {
    let config = JobConfig {
        default_parallelism: 2,
        checkpoint_interval_ms: Some(50),
        batch_size_max: 4,
        window_batches: 2,
        arbiters: Some(2),
        http_addr: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        http_actions: actions,
        ..JobConfig::default()
    }
    .with_store_dir(root, "served")
    .expect("a store");
    let job = Job::new("served", config);
    let output = CollectHandle::new();
    tenths::declare(
        &job,
        8_000,
        SlowCommits::new(output, 0, false).with_write_delay_ms(2),
    );
    let running = job.start().expect("the job starts");
    let addr = running.http_addr().expect("the server runs");
    assert!(addr.ip().is_loopback());
    (running, format!("http://{addr}"))
}

/// GET or POST `path`: the status and the body (4xx and 5xx included).
fn call(method: &str, url: &str) -> (u16, String, String) {
    let request = ureq::request(method, url).timeout(Duration::from_secs(10));
    let response = match request.call() {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(error) => panic!("{method} {url}: {error}"),
    };
    let status = response.status();
    let content_type = response.header("Content-Type").unwrap_or("").to_owned();
    let body = response.into_string().expect("a text body");
    (status, content_type, body)
}

fn json(url: &str) -> Value {
    let (status, content_type, body) = call("GET", url);
    assert_eq!(status, 200, "{url}: {body}");
    assert_eq!(content_type, "application/json");
    serde_json::from_str(&body).expect("JSON")
}

/// Polls `url` until `ready` holds (at most 20 s).
fn wait_for(url: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = json(url);
        if ready(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{url} never got ready: {value}");
        thread::sleep(Duration::from_millis(50));
    }
}

fn completed_of_kind(checkpoints: &Value, kind: &str) -> Vec<u64> {
    checkpoints["history"]
        .as_array()
        .expect("a history")
        .iter()
        .filter(|c| c["kind"] == kind && c["status"] == "completed")
        .filter_map(|c| c["id"].as_u64())
        .collect()
}

#[test]
fn the_api_and_the_exposition_show_the_running_job() {
    let root = tempfile::tempdir().expect("a directory");
    let (running, base) = start(root.path(), false);
    let graph = json(&format!("{base}/api/job"));
    assert_eq!(graph["job"], "served");
    let names: Vec<&str> = graph["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .map(|o| o["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["numbers", "tenths", "count", "out"]);
    assert!(graph["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .all(|o| o["parallelism"] == 2));
    assert_eq!(graph["operators"][0]["kind"], "source");
    assert_eq!(graph["edges"][1]["partition"], "hash");
    assert_eq!(graph["edges"][1]["from"], "tenths");
    let checkpoints = wait_for(&format!("{base}/api/checkpoints"), |c| {
        c["completed"].as_u64().unwrap_or(0) >= 2
    });
    let first = &checkpoints["history"][0];
    assert!(first["duration_ms"].is_u64() && first["alignment_max_us"].is_u64());
    assert_eq!(first["total_subtasks"], 8);
    let metrics = wait_for(&format!("{base}/api/metrics"), |m| {
        m["operators"][3]["records_in"].as_u64().unwrap_or(0) > 0
    });
    assert_eq!(metrics["enabled"], true);
    let operators = json(&format!("{base}/api/operators"));
    assert_eq!(operators.as_array().expect("a list").len(), 4);
    assert_eq!(
        operators[2]["subtasks"].as_array().expect("subtasks").len(),
        2
    );
    let failure = json(&format!("{base}/api/failure"));
    assert!(failure["last_failure"].is_null());
    assert_eq!(failure["restarts_total"], 0);

    let (status, content_type, text) = call("GET", &format!("{base}/metrics"));
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let lines = text.lines().map(|line| Ok(line.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    let value = |name: &str, operator: Option<&str>| -> Vec<f64> {
        scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .filter(|s| operator.is_none() || s.labels.get("operator") == operator)
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .collect()
    };
    let counted = value("snapflow_records_in_total", Some("count"));
    assert_eq!(counted.len(), 2, "one sample per subtask: {text}");
    assert!(counted.iter().sum::<f64>() > 0.0);
    assert!(value("snapflow_checkpoints_completed_total", None)[0] >= 2.0);
    assert_eq!(value("snapflow_backpressured_ms_per_second", None).len(), 8);
    assert!(!value("snapflow_channel_fill", None).is_empty());
    // The in-memory source knows its records left; nothing here counts
    // bytes (memory and the collect sink are not outside the job).
    let left = value("snapflow_source_pending_records", Some("numbers"));
    assert_eq!(left.len(), 2, "one sample per source subtask: {text}");
    assert!(left.iter().all(|&left| left <= 8_000.0));
    assert!(value("snapflow_bytes_in_total", None).is_empty());
    assert!(scrape.docs.contains_key("snapflow_bytes_out"));
    assert_eq!(
        scrape.docs.get("snapflow_restarts").map(String::as_str),
        Some("Restarts of failover regions.")
    );

    let (status, content_type, page) = call("GET", &format!("{base}/"));
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/html"));
    assert!(page.contains("id=\"graph\"") && page.contains("/api/metrics"));
    // Nothing is loaded from the network: the only URL is the SVG
    // namespace, a name that is never fetched.
    let without_namespace = page.replace("http://www.w3.org/2000/svg", "");
    assert!(
        !without_namespace.contains("http://") && !without_namespace.contains("https://"),
        "the page refers to the network"
    );
    assert_eq!(call("GET", &format!("{base}/nothing")).0, 404);
    for action in ["savepoint", "stop", "cancel"] {
        let (status, _, body) = call("POST", &format!("{base}/api/{action}"));
        assert_eq!(status, 403, "{action} without actions: {body}");
        assert!(body.contains("disabled"));
    }
    assert_eq!(call("POST", &format!("{base}/api/nothing")).0, 404);
    running.cancel();
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
}

#[test]
fn enabled_actions_take_a_savepoint_then_stop_with_one() {
    let root = tempfile::tempdir().expect("a directory");
    let (running, base) = start(root.path(), true);
    let url = format!("{base}/api/checkpoints");
    wait_for(&url, |c| c["completed"].as_u64().unwrap_or(0) >= 1);
    let (status, _, body) = call("POST", &format!("{base}/api/savepoint"));
    assert_eq!(status, 202, "{body}");
    assert!(body.contains("\"requested\":\"savepoint\""), "{body}");
    let checkpoints = wait_for(&url, |c| !completed_of_kind(c, "savepoint").is_empty());
    let savepoint = completed_of_kind(&checkpoints, "savepoint")[0];
    let store = FsCheckpointStore::open_read_only(root.path(), "served").expect("the store");
    let stored: Vec<u64> = store
        .list()
        .expect("a listing")
        .iter()
        .filter(|entry| entry.kind == CheckpointKind::Savepoint)
        .map(|entry| entry.checkpoint)
        .collect();
    assert!(stored.contains(&savepoint), "{stored:?} lacks {savepoint}");
    // The job kept running: later checkpoints complete after it.
    wait_for(&url, |c| {
        completed_of_kind(c, "checkpoint")
            .iter()
            .any(|id| *id > savepoint)
    });
    let (status, _, body) = call("POST", &format!("{base}/api/stop"));
    assert_eq!(status, 202, "{body}");
    let report = running.wait().expect("stopped with a savepoint");
    let stop = report.savepoint.expect("a stop savepoint");
    assert!(stop > savepoint);
}

#[test]
fn enabled_cancel_cancels_the_job() {
    let root = tempfile::tempdir().expect("a directory");
    let (running, base) = start(root.path(), true);
    let (status, _, body) = call("POST", &format!("{base}/api/cancel"));
    assert_eq!(status, 202, "{body}");
    assert!(matches!(running.wait(), Err(JobError::Cancelled)));
}

/// What a job gets without asking: no server, and when one is asked for
/// with the default address, it binds to loopback with the actions off.
#[test]
fn the_defaults_bind_to_loopback_with_the_actions_off() {
    let config = JobConfig::default();
    assert_eq!(config.http_addr, None, "no server unless configured");
    assert!(!config.http_actions, "actions are off unless enabled");
    assert!(
        snapflow::job::DEFAULT_HTTP_ADDR.ip().is_loopback(),
        "{}",
        snapflow::job::DEFAULT_HTTP_ADDR
    );
}
