//! clickstream: per-user activity alerts over event time. A shop's click
//! log arrives as JSON lines of `{"user", "ts_ms", "amount_cents"}`, up to
//! 4 s out of order, plus a few events that arrive minutes late. The job
//! counts each user's events and spend in 60 s sliding windows of event
//! time (a new window every 10 s), with a watermark of 5 s of bounded
//! out-of-orderness, and raises an alert for a window that holds more than
//! 20 events or more than 100,000 cents. Alerts go to the exactly-once
//! file sink; the late events are dropped and counted. Two planned crashes
//! restart the job from its last checkpoint, and the committed alerts are
//! checked against a direct computation over the log: every alert once,
//! none missing, none extra.
//!
//! The graph: `clicks` (the file source, one subtask for one log file,
//! parsing each JSON line into a click and assigning its event time) →
//! `crash-plan` (the planned crashes panic here) → key_by user →
//! `activity` (sliding windows, incremental count and sum) → `alerts`
//! (filter) → `alert-files` (exactly-once file sink).
//!
//! Why the check can be exact: every on-time event is at most 4 s older
//! than the newest event before it, under the watermark's 5 s bound, so no
//! on-time event is ever late; every late event is over six minutes older
//! than the events a full read batch (1,024 records) before it, so its
//! windows have always fired when it comes, whatever the batching, the
//! parallelism or the restarts.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use snapflow::job::{Aggregator, Job};
use snapflow::runtime::BoxError;
use snapflow::sink::{committed_files, FileSinkFactory};
use snapflow::source::{Source, SourceError, SourceFactory, SourcePoll, SourcePosition};
use snapflow::time::{LateRecords, WatermarkStrategy, Windowed, Windows};
use snapflow::Snapshot;

use crate::common::Pacing;
use crate::common::{
    check_crashes, fresh_store, positive, print_report, CommonArgs, CommonOptions, CrashPlan,
    CrashSpec, ExampleError, ExampleOptions, Rng,
};
use crate::lines::{FileWithOffsets, FileWithOffsetsReader};

/// The window size.
pub const WINDOW_MS: u64 = 60_000;
/// A new window starts this often.
pub const SLIDE_MS: u64 = 10_000;
/// The watermark's bound on disorder.
pub const OUT_OF_ORDERNESS_MS: u64 = 5_000;
/// A window with more events than this raises an alert.
pub const ALERT_EVENTS: u64 = 20;
/// A window with more spend than this raises an alert.
pub const ALERT_CENTS: u64 = 100_000;
/// Event time between consecutive events of the log.
const SPACING_MS: u64 = 100;
/// The most an on-time event is older than its predecessors.
const JITTER_MS: u64 = 4_000;
/// How much older than its neighbours a late event is, at least.
const LATE_BY_MS: u64 = 400_000;
/// A late event comes only after this many events (a late event needs
/// history to be late against; see the module docs).
const LATE_AFTER_EVENTS: u64 = 6_000;

/// The options of the clickstream example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Events in the log.
    pub events: u64,
    /// Distinct users.
    pub users: u64,
    /// Parallelism (of every operator but the source), crashes,
    /// checkpoints and pace.
    pub common: CommonOptions,
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            events: 60_000,
            users: 30,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        let mut common = CommonOptions::smoke();
        common.crashes = CrashSpec::Random { count: 2, seed: 11 };
        Options {
            events: 9_000,
            users: 30,
            common,
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            events: args.events.unwrap_or(defaults.events),
            users: args.users.unwrap_or(defaults.users),
            common: args.common.apply(defaults.common),
        }
    }
}

/// clickstream: per-user activity alerts over event time (sliding
/// windows, a watermark, late events dropped) into the exactly-once file
/// sink, checked after injected crashes against a direct computation.
/// Its smoke run plans two crashes (seed 11).
#[derive(Debug, clap::Parser)]
#[command(name = "clickstream", args_override_self = true)]
pub struct Args {
    /// Events in the log [default: 60000, 9000 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    events: Option<u64>,
    /// Distinct users [default: 30].
    #[arg(long, value_name = "U", value_parser = positive)]
    users: Option<u64>,
    #[command(flatten)]
    common: CommonArgs,
}

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Click {
    /// Who clicked.
    pub user: u64,
    /// When, in ms of event time.
    pub ts_ms: u64,
    /// What they spent, in cents (0 for a plain click).
    pub amount_cents: u64,
}

/// A window's activity: its events and their spend.
#[derive(Snapshot, Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Activity {
    /// Events in the window.
    pub events: u64,
    /// Their spend in cents.
    pub cents: u64,
}

impl Activity {
    fn add(&mut self, click: &Click) {
        self.events += 1;
        self.cents += click.amount_cents;
    }

    /// Whether this window raises an alert.
    pub fn alerts(&self) -> bool {
        self.events > ALERT_EVENTS || self.cents > ALERT_CENTS
    }
}

/// Counts and sums a window's clicks.
struct ActivityOf;

impl Aggregator<Click> for ActivityOf {
    type Accumulator = Activity;
    type Output = Activity;

    fn add(&self, activity: &mut Activity, click: Click) -> Result<(), BoxError> {
        activity.add(&click);
        Ok(())
    }

    fn result(&self, activity: &Activity) -> Activity {
        *activity
    }
}

/// One alert as the sink writes it and the check reads it back.
type Alert = Windowed<u64, Activity>;

/// The alert's line in the output files.
fn alert_line(alert: &Alert) -> String {
    format!(
        "user={} window=[{},{}) events={} cents={}",
        alert.key, alert.start_ms, alert.end_ms, alert.result.events, alert.result.cents
    )
}

/// The click log: (line, whether the event is late by design).
fn generate(options: &Options) -> Vec<(String, bool)> {
    let mut rng = Rng::new(5);
    (0..options.events)
        .map(|index| {
            let base_ms = 1_000_000 + index * SPACING_MS;
            let late = index >= LATE_AFTER_EVENTS && rng.below(200) == 0;
            let ts_ms = if late {
                base_ms - LATE_BY_MS - rng.below(60_000)
            } else {
                base_ms - rng.below(JITTER_MS)
            };
            // A skewed choice of user: low ids click far more often, so
            // some windows cross the event threshold and most do not.
            let spread = rng.below(options.users) + 1;
            let user = rng.below(spread);
            let amount_cents = match rng.below(20) {
                0 => 20_000 + rng.below(40_000),
                1..=6 => 100 + rng.below(5_000),
                _ => 0,
            };
            let click = Click {
                user,
                ts_ms,
                amount_cents,
            };
            let line = serde_json::to_string(&click).expect("a click serializes");
            (line, late)
        })
        .collect()
}

/// Writes the log to `path`, one JSON object a line.
fn write_log(path: &Path, lines: &[(String, bool)]) -> Result<(), ExampleError> {
    let io = |source| ExampleError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(io)?);
    for (line, _) in lines {
        writeln!(file, "{line}").map_err(io)?;
    }
    file.flush().map_err(io)
}

/// The byte offset each line of `lines` starts at in the log.
fn offsets(lines: &[(String, bool)]) -> Vec<u64> {
    lines
        .iter()
        .scan(0, |offset, (line, _)| {
            let start = *offset;
            *offset += line.len() as u64 + 1;
            Some(start)
        })
        .collect()
}

/// The direct computation: every window of every user holding an on-time
/// click, as its alert line when it alerts.
fn direct_alerts(lines: &[(String, bool)]) -> BTreeSet<String> {
    let windows = Windows::sliding(WINDOW_MS, SLIDE_MS).expect("valid windows");
    let mut activity: std::collections::BTreeMap<(u64, u64), Activity> = Default::default();
    for (line, late) in lines {
        if *late {
            continue;
        }
        let click: Click = serde_json::from_str(line).expect("the log is valid JSON");
        for start_ms in windows.starts_of(click.ts_ms) {
            activity
                .entry((click.user, start_ms))
                .or_default()
                .add(&click);
        }
    }
    activity
        .into_iter()
        .filter(|(_, activity)| activity.alerts())
        .map(|((user, start_ms), activity)| {
            alert_line(&Windowed {
                key: user,
                start_ms,
                end_ms: start_ms + WINDOW_MS,
                result: activity,
            })
        })
        .collect()
}

/// Runs the example; `Ok` only when the committed alerts equal the direct
/// computation's.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let common = &options.common;
    let store = fresh_store(&common.checkpoint_root, "clickstream")?;
    let work = store.job_dir().join("clickstream-files");
    clear(&work)?;
    let log = work.join("clicks.jsonl");
    let lines = generate(options);
    write_log(&log, &lines)?;
    let late = lines.iter().filter(|(_, late)| *late).count() as u64;
    let offsets = offsets(&lines);
    let crash_lines = common.crashes.records(lines.len() as u64);
    let crash_offsets = crash_lines.iter().map(|&line| offsets[line as usize]);
    let crashes = CrashPlan::new(crash_offsets.collect());
    println!(
        "clickstream: {} JSON lines ({late} late by design) from {} users in {}, parallelism {}, \
         checkpoints every {} ms in {}",
        lines.len(),
        options.users,
        log.display(),
        common.parallelism,
        common.checkpoint_interval_ms,
        store.job_dir().display()
    );
    println!("  crashes planned in `parse` at lines {crash_lines:?}");

    let output = work.join("alerts");
    let job = Job::new(
        "clickstream",
        common.job_config(Arc::new(store), crashes.planned()),
    );
    let invalid = Arc::new(AtomicU64::new(0));
    let dropped = declare(&job, &log, &output, common, (&crashes, &invalid))?;
    let report = common.run(job)?;
    print_report(&report);
    check_crashes(&crashes, &report)?;
    let committed = committed_alerts(&output)?;
    println!(
        "done: {} alerts committed; {} late records dropped (a late record replayed after a \
         restart counts again)",
        committed.len(),
        dropped.dropped()
    );
    let invalid = invalid.load(Ordering::Relaxed);
    if invalid != 0 {
        return Err(ExampleError::Mismatch(format!(
            "{invalid} lines of the generated log were not clicks"
        )));
    }
    check(&committed, &direct_alerts(&lines), late, dropped.dropped())?;
    println!(
        "check: OK, the committed alerts equal the direct computation's, each once, despite {} \
         crashes",
        report.restarts.len()
    );
    Ok(())
}

/// clicks → parse → key_by user → activity → alerts → alert-files.
fn declare(
    job: &Job,
    log: &Path,
    output: &Path,
    common: &CommonOptions,
    (crashes, invalid): (&CrashPlan, &Arc<AtomicU64>),
) -> Result<LateRecords, ExampleError> {
    let invalid = Arc::clone(invalid);
    let crashes = crashes.clone();
    let windows = Windows::sliding(WINDOW_MS, SLIDE_MS).map_err(usage)?;
    let sink = FileSinkFactory::new(output, |alert: &Alert, out: &mut Vec<u8>| {
        out.extend_from_slice(alert_line(alert).as_bytes());
        out.push(b'\n');
    })
    .and_then(|sink| sink.prefix("alerts"))
    .map_err(|error| usage(format!("the alert sink: {error}")))?;
    let (activity, late) = job
        .source("clicks", ClickLog::new(log, common.pacing(), invalid))
        .parallelism(1)
        .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(
            OUT_OF_ORDERNESS_MS,
            |(_, click): &(u64, Click)| click.ts_ms,
        ))
        .map("crash-plan", move |(offset, click): (u64, Click)| {
            crashes.check(offset);
            click
        })
        .key_by(|click: &Click| click.user)
        .window(windows, |click: &Click| click.ts_ms)
        .aggregate("activity", ActivityOf);
    activity
        .filter("alerts", |window: &Alert| window.result.alerts())
        .sink("alert-files", sink);
    Ok(late)
}

/// The click log as a source of `(byte offset, click)`: the file source's
/// lines (its positions are byte offsets, so a restart resumes at the
/// exact line), parsed from JSON as they are read. A line that is not a
/// click is dropped and counted: a log written by many producers holds
/// the odd broken line, and one must not stop the job.
struct ClickLog {
    lines: FileWithOffsets,
    invalid: Arc<AtomicU64>,
}

impl ClickLog {
    fn new(path: &Path, pacing: Pacing, invalid: Arc<AtomicU64>) -> ClickLog {
        ClickLog {
            lines: FileWithOffsets::new(path, pacing),
            invalid,
        }
    }
}

impl SourceFactory for ClickLog {
    type Source = ClickReader;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<ClickReader, SourceError> {
        Ok(ClickReader {
            lines: self.lines.split(subtask, parallelism)?,
            invalid: Arc::clone(&self.invalid),
            buffer: Vec::new(),
        })
    }
}

/// One subtask's clicks; its position and seek are the file source's.
struct ClickReader {
    lines: FileWithOffsetsReader,
    invalid: Arc<AtomicU64>,
    /// Reused between polls; at most one read batch long.
    buffer: Vec<(u64, String)>,
}

impl Source for ClickReader {
    type Item = (u64, Click);

    fn poll_batch(
        &mut self,
        out: &mut Vec<(u64, Click)>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        self.buffer.clear();
        let status = self.lines.poll_batch(&mut self.buffer, max_records)?;
        let before = out.len();
        for (offset, line) in self.buffer.drain(..) {
            match serde_json::from_str::<Click>(&line) {
                Ok(click) => out.push((offset, click)),
                Err(_) => {
                    self.invalid.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(match status {
            SourcePoll::Produced(_) => SourcePoll::Produced(out.len() - before),
            other => other,
        })
    }

    fn position(&self) -> SourcePosition {
        self.lines.position()
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        self.lines.seek(position)
    }
}

fn usage(error: impl std::fmt::Display) -> ExampleError {
    ExampleError::Usage(error.to_string())
}

/// Removes and recreates `dir`.
fn clear(dir: &PathBuf) -> Result<(), ExampleError> {
    let io = |source| ExampleError::Io {
        path: dir.clone(),
        source,
    };
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(io(source)),
    }
    std::fs::create_dir_all(dir).map_err(io)
}

/// Every line of the committed alert files, in file order.
fn committed_alerts(output: &Path) -> Result<Vec<String>, ExampleError> {
    let files = committed_files(output, "alerts").map_err(|error| ExampleError::Io {
        path: output.to_path_buf(),
        source: std::io::Error::other(error.to_string()),
    })?;
    let mut alerts = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).map_err(|source| ExampleError::Io {
            path: file.clone(),
            source,
        })?;
        alerts.extend(text.lines().map(str::to_string));
    }
    Ok(alerts)
}

/// The committed alerts hold each expected alert once and nothing else,
/// and every late event was dropped (at least once: replays count again).
fn check(
    committed: &[String],
    expected: &BTreeSet<String>,
    late: u64,
    dropped: u64,
) -> Result<(), ExampleError> {
    let mut seen = BTreeSet::new();
    if let Some(twice) = committed.iter().find(|alert| !seen.insert(alert.as_str())) {
        return Err(ExampleError::Mismatch(format!(
            "alert committed twice: {twice}"
        )));
    }
    let committed: BTreeSet<String> = seen.into_iter().map(str::to_string).collect();
    if let Some(missing) = expected.difference(&committed).next() {
        return Err(ExampleError::Mismatch(format!(
            "{} alerts missing, e.g. {missing}",
            expected.difference(&committed).count()
        )));
    }
    if let Some(extra) = committed.difference(expected).next() {
        return Err(ExampleError::Mismatch(format!(
            "{} alerts not in the direct computation, e.g. {extra}",
            committed.difference(expected).count()
        )));
    }
    if dropped < late {
        return Err(ExampleError::Mismatch(format!(
            "{dropped} late records dropped, but the log has {late} late events"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alerts(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|line| line.to_string()).collect()
    }

    #[test]
    fn the_same_alerts_pass() {
        let expected: BTreeSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        assert!(check(&alerts(&["b", "a"]), &expected, 3, 3).is_ok());
    }

    #[test]
    fn a_duplicate_a_missing_or_an_extra_alert_is_a_mismatch() {
        let expected: BTreeSet<String> = ["a", "b"].iter().map(|s| s.to_string()).collect();
        assert!(check(&alerts(&["a", "b", "a"]), &expected, 0, 0).is_err());
        assert!(check(&alerts(&["a"]), &expected, 0, 0).is_err());
        assert!(check(&alerts(&["a", "b", "c"]), &expected, 0, 0).is_err());
    }

    #[test]
    fn fewer_drops_than_late_events_is_a_mismatch() {
        let expected: BTreeSet<String> = BTreeSet::new();
        assert!(check(&[], &expected, 2, 1).is_err());
    }

    #[test]
    fn the_log_has_late_events_and_alerts_of_both_kinds() {
        let options = Options::smoke();
        let lines = generate(&options);
        let late = lines.iter().filter(|(_, late)| *late).count();
        assert!(late > 5, "{late} late events");
        let expected = direct_alerts(&lines);
        let by_events = expected.iter().filter(|a| a.contains("events=2")).count();
        assert!(expected.len() > 10, "{} alerts", expected.len());
        assert!(by_events > 0);
        // Some windows alert on spend alone.
        let spend_only = expected.iter().any(|alert| {
            let events: u64 = alert
                .split("events=")
                .nth(1)
                .and_then(|rest| rest.split(' ').next())
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            events <= ALERT_EVENTS
        });
        assert!(spend_only, "no window alerts on spend alone");
    }
}
