//! The web dashboard in a real browser: the wordcount example runs with
//! `--http`, headless Chromium (driven by chromedriver over WebDriver)
//! opens its page, and the test checks that the graph shows every
//! operator with its parallelism, that the source's rows show its bytes
//! read and its lag (bytes left) as figures (and the in-memory sink no
//! bytes written), that a new checkpoint row appears while it watches, and that the savepoint button puts a savepoint into the
//! store; then the stop button ends the example with a savepoint. A
//! screenshot goes to `target/dashboard/dashboard.png` (CI keeps it).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/chromium.sh`
//! installs them). Without them the test says so and passes, except in
//! CI (`CI=true`), where it fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};
use snapflow::storage::{CheckpointKind, CheckpointStore, FsCheckpointStore};
use snapflow_examples::common::{CrashSpec, ExampleError, ExampleOptions};
use snapflow_examples::wordcount;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// The browser and its driver: `SNAPFLOW_CHROMIUM` / `SNAPFLOW_CHROMEDRIVER`
/// or Debian's paths.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let path = |var: &str, default: &str| {
        PathBuf::from(std::env::var(var).unwrap_or_else(|_| default.to_owned()))
    };
    let chromium = path("SNAPFLOW_CHROMIUM", "/usr/bin/chromium");
    let driver = path("SNAPFLOW_CHROMEDRIVER", "/usr/bin/chromedriver");
    if chromium.exists() && driver.exists() {
        return Some((chromium, driver));
    }
    let message = format!(
        "the dashboard test needs {} and {} (install them with `bash .ci/chromium.sh`)",
        chromium.display(),
        driver.display()
    );
    if std::env::var("CI").is_ok_and(|value| value == "true") {
        panic!("{message}; in CI it may not be skipped");
    }
    eprintln!("SKIPPED: {message}");
    None
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("an address").port()
}

/// Polls `ready` every 100 ms until it gives a value (at most `seconds`).
fn eventually<T>(seconds: u64, what: &str, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(100));
    }
}

fn get_json(url: &str) -> Option<Value> {
    let response = ureq::get(url).timeout(Duration::from_secs(5)).call().ok()?;
    response.into_json().ok()
}

/// chromedriver, killed when dropped.
struct Driver {
    child: Child,
    base: String,
    session: Option<String>,
}

impl Driver {
    fn start(driver: &Path, chromium: &Path) -> Driver {
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: None,
        };
        let status = format!("{}/status", driver.base);
        eventually(20, "chromedriver", || {
            get_json(&status).filter(|s| s["value"]["ready"] == true)
        });
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                         "--disable-gpu", "--window-size=1400,1200"]
            }
        }}});
        let answer = driver.call("POST", "/session", capabilities);
        let session = answer["sessionId"].as_str().expect("a session").to_owned();
        driver.session = Some(session);
        driver
    }

    /// One WebDriver command; its `value` (panics on an error answer).
    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = match &self.session {
            Some(session) if path != "/session" => format!("{}/session/{session}{path}", self.base),
            _ => format!("{}{path}", self.base),
        };
        let request = ureq::request(method, &url).timeout(Duration::from_secs(60));
        let response = match method {
            "GET" | "DELETE" => request.call(),
            _ => request.send_json(body),
        };
        let answer: Value = match response {
            Ok(response) => response.into_json().expect("JSON"),
            Err(ureq::Error::Status(code, response)) => {
                panic!(
                    "{method} {path}: {code} {}",
                    response.into_string().unwrap_or_default()
                )
            }
            Err(error) => panic!("{method} {path}: {error}"),
        };
        answer["value"].clone()
    }

    fn elements(&self, css: &str) -> Vec<String> {
        let found = self.call(
            "POST",
            "/elements",
            json!({"using": "css selector", "value": css}),
        );
        found
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The attributes `names` of every element matching `css`, read in
    /// one script run (the page redraws every second, so elements found
    /// by one command may be gone at the next).
    fn attributes(&self, css: &str, names: &[&str]) -> Vec<Vec<String>> {
        let script = "return Array.from(document.querySelectorAll(arguments[0]))\
            .map(e => arguments[1].map(n => e.getAttribute(n) || ''));";
        let rows = self.call(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": [css, names]}),
        );
        rows.as_array()
            .map(|rows| {
                rows.iter()
                    .map(|row| {
                        row.as_array()
                            .map(|cells| {
                                cells
                                    .iter()
                                    .map(|cell| cell.as_str().unwrap_or_default().to_owned())
                                    .collect()
                            })
                            .unwrap_or_default()
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    fn click(&self, css: &str) {
        let element = self.elements(css).pop().expect("the button");
        self.call("POST", &format!("/element/{element}/click"), json!({}));
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.session.is_some() {
            let url = format!(
                "{}/session/{}",
                self.base,
                self.session.as_deref().unwrap_or_default()
            );
            let _ = ureq::delete(&url).call();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn checkpoint_rows(driver: &Driver) -> Vec<(u64, String, String)> {
    driver
        .attributes(
            "tr.checkpoint-row",
            &["data-id", "data-kind", "data-status"],
        )
        .into_iter()
        .filter_map(|row| Some((row[0].parse().ok()?, row[1].clone(), row[2].clone())))
        .collect()
}

/// A text of 33,334 lines of 12 words, as the example generates, written
/// into `directory`.
fn input_file(directory: &Path) -> PathBuf {
    let lines: Vec<String> = (0..33_334_u64)
        .map(|line| {
            let words: Vec<String> = (0..12)
                .map(|word| format!("w{}", (line * 12 + word) % 997))
                .collect();
            words.join(" ")
        })
        .collect();
    let path = directory.join("input.txt");
    std::fs::write(&path, lines.join("\n")).expect("the input is written");
    path
}

/// The operator table's rows as (operator, bytes in, bytes out, lag),
/// the cells found by their column's heading, read in one script run.
fn byte_columns(driver: &Driver) -> Vec<(String, String, String, String)> {
    let script = "const heads = Array.from(document.querySelectorAll('#operators thead th'))\
            .map(th => th.textContent.trim());\
        const at = (cells, name) => { const i = heads.indexOf(name); \
            return i < 0 || i >= cells.length ? '' : cells[i].textContent; };\
        return Array.from(document.querySelectorAll('#operators tbody tr')).map(tr => {\
            const cells = Array.from(tr.children);\
            return [tr.getAttribute('data-operator') || '', at(cells, 'bytes in'),\
                at(cells, 'bytes out'), at(cells, 'lag')]; });";
    let rows = driver.call(
        "POST",
        "/execute/sync",
        json!({"script": script, "args": []}),
    );
    let text = |cell: &Value| cell.as_str().unwrap_or_default().to_owned();
    rows.as_array()
        .map(|rows| {
            rows.iter()
                .map(|row| (text(&row[0]), text(&row[1]), text(&row[2]), text(&row[3])))
                .collect()
        })
        .unwrap_or_default()
}

/// A figure the page wrote as a number with a unit (`12.5 KiB`, `300 B`,
/// `1,200 records`), not the dash of an absent one.
fn is_figure(cell: &str) -> bool {
    cell.chars()
        .next()
        .is_some_and(|first| first.is_ascii_digit())
}

/// The source's rows show bytes in and a lag in bytes above 0 while the
/// paced example reads its file; the sink's rows (a collect sink, which
/// writes nothing outside the job) show no bytes out.
fn check_bytes_and_lag(driver: &Driver, graph: &Value) {
    let named = |kind: &str| -> Vec<String> {
        graph["operators"]
            .as_array()
            .expect("operators")
            .iter()
            .filter(|o| o["kind"] == kind)
            .filter_map(|o| o["name"].as_str().map(str::to_owned))
            .collect()
    };
    let (sources, sinks) = (named("source"), named("sink"));
    assert!(!sources.is_empty() && !sinks.is_empty(), "{graph}");
    eventually(20, "the bytes and lag columns", || {
        let rows = byte_columns(driver);
        let source_rows: Vec<_> = rows.iter().filter(|r| sources.contains(&r.0)).collect();
        let sink_rows: Vec<_> = rows.iter().filter(|r| sinks.contains(&r.0)).collect();
        let sources_shown = !source_rows.is_empty()
            && source_rows.iter().all(|(_, bytes_in, _, lag)| {
                is_figure(bytes_in) && bytes_in != "0 B" && is_figure(lag) && lag.ends_with('B')
            });
        let lag_above_zero = source_rows.iter().any(|(_, _, _, lag)| lag != "0 B");
        // The example's sink collects into memory, outside nothing: its
        // column shows the dash of a figure nobody counts.
        let sinks_shown =
            !sink_rows.is_empty() && sink_rows.iter().all(|(_, _, out, _)| out == "–");
        (sources_shown && lag_above_zero && sinks_shown).then_some(())
    });
}

#[test]
fn the_dashboard_shows_the_job_and_takes_a_savepoint() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let directory = tempfile::tempdir().expect("a directory");
    let port = free_port();
    let mut options = wordcount::Options::full();
    // A file, not generated text: the file source counts its bytes read
    // and knows its lag in bytes, which the page must show.
    let text = tempfile::tempdir().expect("a directory");
    options.input = Some(input_file(text.path()));
    options.common.records_per_second = 1_500;
    options.common.crashes = CrashSpec::None;
    options.common.progress = false;
    options.common.checkpoint_root = directory.path().to_path_buf();
    options.common.http = Some(([127, 0, 0, 1], port).into());
    let example = thread::spawn(move || wordcount::run(&options));
    let base = format!("http://127.0.0.1:{port}");
    let graph = eventually(30, "the example's server", || {
        get_json(&format!("{base}/api/job"))
    });
    let mut expected: Vec<(String, String)> = graph["operators"]
        .as_array()
        .expect("operators")
        .iter()
        .map(|o| {
            (
                o["name"].as_str().unwrap_or("").to_owned(),
                o["parallelism"].to_string(),
            )
        })
        .collect();
    expected.sort();

    let driver = Driver::start(&chromedriver, &chromium);
    driver.call("POST", "/url", json!({ "url": format!("{base}/") }));
    let shown = eventually(20, "the graph", || {
        let mut shown: Vec<(String, String)> = driver
            .attributes("g.operator", &["data-operator", "data-parallelism"])
            .into_iter()
            .map(|row| (row[0].clone(), row[1].clone()))
            .collect();
        shown.sort();
        (shown.len() == expected.len()).then_some(shown)
    });
    assert_eq!(shown, expected, "the graph shows every operator");
    check_bytes_and_lag(&driver, &graph);

    let first = eventually(20, "a checkpoint row", || {
        checkpoint_rows(&driver).iter().map(|row| row.0).max()
    });
    eventually(20, "a new checkpoint row", || {
        checkpoint_rows(&driver)
            .iter()
            .any(|row| row.0 > first && row.2 == "completed")
            .then_some(())
    });

    driver.click("#savepoint");
    let savepoint = eventually(20, "the savepoint's row", || {
        checkpoint_rows(&driver)
            .into_iter()
            .find(|row| row.1 == "savepoint" && row.2 == "completed")
            .map(|row| row.0)
    });
    let store =
        FsCheckpointStore::open_read_only(directory.path(), "wordcount").expect("the store");
    let stored = store.list().expect("a listing");
    assert!(
        stored
            .iter()
            .any(|entry| entry.kind == CheckpointKind::Savepoint && entry.checkpoint == savepoint),
        "savepoint {savepoint} is in the store: {stored:?}"
    );

    let screenshot = driver.call("GET", "/screenshot", Value::Null);
    let png = base64::engine::general_purpose::STANDARD
        .decode(screenshot.as_str().expect("base64"))
        .expect("a PNG");
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/dashboard");
    std::fs::create_dir_all(&target).expect("target/dashboard");
    std::fs::write(target.join("dashboard.png"), &png).expect("the screenshot is written");
    assert!(png.starts_with(b"\x89PNG"));

    driver.click("#stop");
    // A stop with a savepoint is how the examples end early (exit code
    // 0): there is no whole result to check.
    let result = example.join().expect("the example ran");
    assert!(
        matches!(result, Err(ExampleError::Stopped { .. })),
        "the example stopped with a savepoint: {result:?}"
    );
}
