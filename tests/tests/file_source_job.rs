//! The file source through a whole job: a file of 10,000 lines is read at
//! parallelism 1, 2 and 3 with checkpoints every few milliseconds, an
//! operator fails once in the middle, the job restarts from a checkpoint
//! with every file split sought back to its byte offset, and the committed
//! output is the file's lines exactly once (no duplicate, no gap). Files
//! without a trailing newline and with CRLF line ends too.

use std::collections::BTreeMap;
use std::io::Write;

use snapflow::job::{Job, JobConfig, RestartStrategy};
use snapflow::sink::CollectHandle;
use snapflow::source::{FileLinesSourceFactory, Guarantee};
use snapflow_tests::pipeline::{Paced, Pacing};
use snapflow_tests::{FaultKind, Faults};

const LINES: u64 = 10_000;

/// At most 32 lines per poll, resting every other poll, so that
/// checkpoints land while the file is being read.
const PACING: Pacing = Pacing {
    records_per_read: 32,
};

/// How the test file ends its lines.
#[derive(Debug, Clone, Copy)]
struct Layout {
    crlf: bool,
    trailing_newline: bool,
}

const PLAIN: Layout = Layout {
    crlf: false,
    trailing_newline: true,
};

/// Line `i` carries its number first, so an operator can tell which
/// record it holds; lengths vary so splits cut lines at odd offsets.
fn line(i: u64) -> String {
    format!("{i} {}", "word ".repeat((i % 7) as usize).trim_end())
}

fn write_file(layout: Layout) -> tempfile::NamedTempFile {
    let ending = if layout.crlf { "\r\n" } else { "\n" };
    let mut text = (0..LINES).map(line).collect::<Vec<_>>().join(ending);
    if layout.trailing_newline {
        text.push_str(ending);
    }
    let mut file = tempfile::NamedTempFile::new().expect("a temporary file");
    file.write_all(text.as_bytes()).expect("writes");
    file.flush().expect("flushes");
    file
}

fn number_of(line: &str) -> u64 {
    line.split(' ')
        .next()
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("bug in the test: line {line:?} has no number"))
}

fn check(parallelism: usize, layout: Layout) {
    let file = write_file(layout);
    let fail_at = LINES * 3 / 5;
    let faults = Faults::new(vec![("check", fail_at, FaultKind::Panic)]);
    let config = JobConfig {
        checkpoint_interval_ms: Some(3),
        default_parallelism: parallelism,
        batch_size_max: 16,
        arbiters: Some(2),
        restart: RestartStrategy::FixedDelay {
            attempts_max: 2,
            delay_ms: 10,
        },
        ..JobConfig::default()
    };
    let job = Job::new("file-lines", config);
    let output = CollectHandle::new();
    let in_check = faults.clone();
    job.source(
        "lines",
        Paced::over(FileLinesSourceFactory::new(file.path()), PACING),
    )
    .map("check", move |line: String| {
        in_check.check_or_panic("check", number_of(&line));
        line
    })
    .sink("out", output.clone());
    let report = job.run().expect("the job recovers and finishes");

    assert_eq!(faults.fired(), 1, "the failure fired");
    assert_eq!(report.restarts.len(), 1);
    assert!(
        report.restarts[0].restored_from.is_some(),
        "the restart resumed from a checkpoint in the middle of the file"
    );
    assert_eq!(report.guarantee, Guarantee::ExactlyOnce);
    let mut committed: BTreeMap<u64, String> = BTreeMap::new();
    for line in output.committed() {
        let number = number_of(&line);
        if let Some(earlier) = committed.insert(number, line) {
            panic!("line {number} ({earlier:?}) was committed twice");
        }
    }
    let expected: BTreeMap<u64, String> = (0..LINES).map(|i| (i, line(i))).collect();
    assert_eq!(committed.len(), expected.len(), "no line is missing");
    assert_eq!(committed, expected, "every line is exactly the file's line");
}

#[test]
fn parallelism_1() {
    check(1, PLAIN);
}

#[test]
fn parallelism_2() {
    check(2, PLAIN);
}

#[test]
fn parallelism_3() {
    check(3, PLAIN);
}

#[test]
fn no_trailing_newline() {
    check(
        2,
        Layout {
            trailing_newline: false,
            ..PLAIN
        },
    );
}

#[test]
fn crlf_line_ends() {
    check(
        3,
        Layout {
            crlf: true,
            ..PLAIN
        },
    );
}

#[test]
fn crlf_without_trailing_newline() {
    check(
        2,
        Layout {
            crlf: true,
            trailing_newline: false,
        },
    );
}
