//! Bytes in and out and a source's lag in the live metrics
//! (`snapflow::metrics`), at parallelism 1, 2 and 3: a file read by the
//! file source through a map into the file sink, the sink slowed down so
//! the source stays behind while the job runs. At the end the source's
//! bytes in equal the file's length (line endings and a last line without
//! one included), the sink's bytes out equal the committed files' total
//! size, the map counts no bytes (records pass in memory), and the lag
//! shown while running was above 0 and is 0 at the end. The in-memory
//! source shows its records left as its lag. A print sink's bytes out
//! equal what it printed to its writer.

use std::io::Write;
use std::time::Duration;

use snapflow::job::{Job, JobConfig};
use snapflow::metrics::JobMetrics;
use snapflow::sink::{
    committed_files, CollectHandle, FileSinkFactory, PrintSink, SinkError, SinkFactory,
    DEFAULT_PREFIX,
};
use snapflow::source::{FileLinesSourceFactory, VecSourceFactory};
use snapflow_tests::sampled::{run_sampled, Sampled};
use snapflow_tests::slow_commit::SlowCommits;

const LINES: usize = 1_200;

/// Lines of varied lengths, LF-ended except the last (so the file's
/// length is not simply the lines plus one byte each), some with CRs.
fn input_text() -> String {
    let lines: Vec<String> = (0..LINES)
        .map(|i| {
            let ending = if i % 5 == 0 { "\r" } else { "" };
            format!("{i} {}{ending}", "ab".repeat(i % 9))
        })
        .collect();
    lines.join("\n")
}

fn check_file_bytes(parallelism: usize) {
    let text = input_text();
    let mut input = tempfile::NamedTempFile::new().expect("a temporary file");
    input.write_all(text.as_bytes()).expect("writes");
    input.flush().expect("flushes");
    let output = tempfile::tempdir().expect("a temporary directory");
    let job = Job::new(
        "bytes",
        JobConfig {
            default_parallelism: parallelism,
            checkpoint_interval_ms: Some(20),
            batch_size_max: 8,
            window_batches: 2,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let sink = FileSinkFactory::lines(output.path()).expect("a sink");
    job.source("lines", FileLinesSourceFactory::new(input.path()))
        .map("upper", |line: String| line.to_uppercase())
        .sink(
            "files",
            SlowCommits::new(sink, 0, false).with_write_delay_ms(1),
        );
    let running = job.start().expect("the job starts");
    let Sampled { during, last } = run_sampled(running, Duration::from_secs(60));

    let source = last.operator("lines").expect("listed");
    assert_eq!(
        source.bytes_in,
        Some(text.len() as u64),
        "p={parallelism}: the source read the whole file"
    );
    for subtask in &source.subtasks {
        assert!(subtask.bytes_in.is_some(), "every subtask counts");
        assert_eq!(subtask.pending_bytes, Some(0), "nothing left at the end");
        assert_eq!(subtask.splits.len(), 1, "one split per subtask");
        assert_eq!(subtask.splits[0].split, input.path().display().to_string());
    }
    let ends: Vec<u64> = source
        .subtasks
        .iter()
        .map(|s| s.splits[0].position)
        .collect();
    assert_eq!(ends.last().copied(), Some(text.len() as u64), "{ends:?}");
    assert_eq!(source.bytes_out, None, "a source writes nothing outside");
    let upper = last.operator("upper").expect("listed");
    assert_eq!((upper.bytes_in, upper.bytes_out), (None, None));
    assert_eq!(upper.pending_records, None);

    let files = committed_files(output.path(), DEFAULT_PREFIX).expect("listed");
    let written: u64 = files
        .iter()
        .map(|file| std::fs::metadata(file).expect("a committed file").len())
        .sum();
    // The source drops a CR before an LF; the sink ends each line with LF.
    let expected: u64 = text
        .split('\n')
        .map(|line| line.strip_suffix('\r').unwrap_or(line).len() as u64 + 1)
        .sum();
    assert_eq!(written, expected, "bug in the test: the sink's output");
    let sink = last.operator("files").expect("listed");
    assert_eq!(
        sink.bytes_out,
        Some(written),
        "p={parallelism}: the sink's bytes out are its files' size"
    );
    assert_eq!(sink.bytes_in, None);

    check_exposition(&last, text.len() as u64, written);

    let behind = during.iter().any(|metrics| {
        metrics
            .operator("lines")
            .and_then(|source| source.pending_bytes)
            .is_some_and(|pending| pending > 0 && pending < text.len() as u64)
    });
    assert!(
        behind,
        "p={parallelism}: the source's lag showed while it ran"
    );
}

/// The Prometheus exposition of `metrics` parses and carries the bytes
/// (as counters with `_total`), the lag and the split positions.
fn check_exposition(metrics: &JobMetrics, read: u64, written: u64) {
    let text = snapflow::http::render_prometheus(metrics);
    let lines = text.lines().map(|line| Ok(line.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("the exposition parses");
    let sum = |name: &str, operator: &str| -> (usize, f64) {
        let values: Vec<f64> = scrape
            .samples
            .iter()
            .filter(|s| s.metric == name && s.labels.get("operator") == Some(operator))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
            .collect();
        (values.len(), values.iter().sum())
    };
    let parallelism = metrics.operators[0].parallelism;
    assert_eq!(
        sum("snapflow_bytes_in_total", "lines"),
        (parallelism, read as f64),
        "{text}"
    );
    assert_eq!(
        sum("snapflow_bytes_out_total", "files"),
        (parallelism, written as f64)
    );
    assert_eq!(
        sum("snapflow_bytes_in_total", "upper").0,
        0,
        "no bytes counted"
    );
    assert_eq!(
        sum("snapflow_source_pending_bytes", "lines"),
        (parallelism, 0.0)
    );
    let (splits, _) = sum("snapflow_source_split_position", "lines");
    assert_eq!(splits, parallelism);
    assert_eq!(
        scrape.docs.get("snapflow_bytes_in").map(String::as_str),
        Some("Bytes a source read from outside the job.")
    );
    assert!(text.contains("# TYPE snapflow_bytes_out counter"), "{text}");
}

#[test]
fn file_bytes_and_lag_at_parallelism_1() {
    check_file_bytes(1);
}

#[test]
fn file_bytes_and_lag_at_parallelism_2() {
    check_file_bytes(2);
}

#[test]
fn file_bytes_and_lag_at_parallelism_3() {
    check_file_bytes(3);
}

#[test]
fn an_in_memory_source_shows_the_records_left() {
    let job = Job::new(
        "left",
        JobConfig {
            default_parallelism: 2,
            batch_size_max: 4,
            window_batches: 2,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let output = CollectHandle::new();
    job.source("numbers", VecSourceFactory::new((0..400_u64).collect()))
        .sink(
            "out",
            SlowCommits::new(output, 0, false).with_write_delay_ms(1),
        );
    let running = job.start().expect("the job starts");
    let Sampled { during, last } = run_sampled(running, Duration::from_secs(60));
    let source = last.operator("numbers").expect("listed");
    assert_eq!(source.pending_records, Some(0));
    assert_eq!(source.bytes_in, None, "memory is not outside the job");
    let seen: Vec<u64> = during
        .iter()
        .filter_map(|m| m.operator("numbers").and_then(|s| s.pending_records))
        .collect();
    assert!(
        seen.iter().any(|&left| left > 0 && left < 400),
        "the records left while running: {seen:?}"
    );
    assert_eq!(last.operator("out").expect("listed").bytes_out, None);
}

/// A writer shared by every print sink subtask of a test, so that the
/// test reads what was printed.
#[derive(Clone, Default)]
struct SharedWriter(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for SharedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut printed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        printed.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Print sinks writing into one [`SharedWriter`].
#[derive(Clone)]
struct PrintInto(SharedWriter);

impl SinkFactory for PrintInto {
    type Sink = PrintSink<String, SharedWriter>;

    fn create(&self, _subtask: usize, _parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(PrintSink::new(self.0.clone()))
    }
}

fn check_print_bytes(parallelism: usize) {
    let job = Job::new(
        "printed",
        JobConfig {
            default_parallelism: parallelism,
            checkpoint_interval_ms: Some(20),
            batch_size_max: 8,
            arbiters: Some(2),
            ..JobConfig::default()
        },
    );
    let printed = SharedWriter::default();
    job.source("numbers", VecSourceFactory::new((0..3_000_u64).collect()))
        // Lines of varied lengths, some with multi-byte characters.
        .map("words", |n: u64| {
            "é".repeat((n % 4) as usize) + &n.to_string()
        })
        .sink("print", PrintInto(printed.clone()));
    let running = job.start().expect("the job starts");
    let Sampled { last, .. } = run_sampled(running, Duration::from_secs(60));
    let printed = printed.0.lock().expect("not poisoned").clone();
    assert_eq!(
        printed.iter().filter(|&&byte| byte == b'\n').count(),
        3_000,
        "bug in the test: every record printed once"
    );
    let sink = last.operator("print").expect("listed");
    assert_eq!(
        sink.bytes_out,
        Some(printed.len() as u64),
        "p={parallelism}: the print sink's bytes out are what it printed"
    );
    let per_subtask: u64 = sink.subtasks.iter().filter_map(|s| s.bytes_out).sum();
    assert_eq!(per_subtask, printed.len() as u64);
}

#[test]
fn print_sink_bytes_at_parallelism_1() {
    check_print_bytes(1);
}

#[test]
fn print_sink_bytes_at_parallelism_3() {
    check_print_bytes(3);
}
