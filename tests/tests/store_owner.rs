//! One owner per store (issue 36, finding 1): two processes of the same
//! job (`job_runner` children) on one checkpoint store, or on one file
//! sink's output directory, started at once or a few hundred
//! milliseconds apart. The second fails at once with the typed,
//! non-retryable `StoreInUse` (or the file sink's `DirectoryInUse`)
//! naming the directory and the owner's pid; the first finishes, and the
//! committed output is exactly the failure-free run's. A process killed
//! with SIGKILL leaves no lock behind: the next one resumes on the same
//! store.
//!
//! Before the lock, two processes on one store and output committed a
//! torn line and tens of thousands of duplicate and missing records, and
//! both reported exactly-once.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use snapflow_tests::crash::{kill, spawn};
use snapflow_tests::pipeline;

/// Enough records that the first process is still running when the
/// second one starts a few hundred milliseconds later (about 2 s at the
/// runner's pace on two cores).
const RECORDS: u64 = 12_000;

/// How long any one process may take before the test calls it hung.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// What the second process shares with the first.
#[derive(Debug, Clone, Copy)]
enum Shared {
    /// The same checkpoint store and the same output directory.
    StoreAndOutput,
    /// Only the output directory: each has a store of its own.
    Output,
}

/// When the second process starts.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// Right after the first, before either has opened anything.
    AtOnce,
    /// This long after the first, while it runs.
    AfterMs(u64),
}

struct Dirs {
    _root: tempfile::TempDir,
    stores: [PathBuf; 2],
    output: PathBuf,
}

impl Dirs {
    fn new(shared: Shared) -> Dirs {
        let root = tempfile::tempdir().expect("a temporary directory");
        let first = root.path().join("store-a");
        let second = match shared {
            Shared::StoreAndOutput => first.clone(),
            Shared::Output => root.path().join("store-b"),
        };
        Dirs {
            output: root.path().join("output"),
            stores: [first, second],
            _root: root,
        }
    }
}

fn runner(store: &Path, output: &Path, parallelism: usize) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_job_runner"));
    command
        .arg(store)
        .arg(RECORDS.to_string())
        .arg(parallelism.to_string())
        .arg("file")
        .arg(output);
    command
}

/// Waits for `child` to end within [`RUN_LIMIT`].
fn wait(child: Child, what: &str) -> Output {
    let started = Instant::now();
    let mut child = child;
    while child
        .try_wait()
        .expect("the child can be waited for")
        .is_none()
    {
        if started.elapsed() > RUN_LIMIT {
            kill(child);
            panic!("{what} did not end in {RUN_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("the child's output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The committed output is exactly the failure-free run's.
fn assert_exactly_once(output: &Path, case: &str) {
    pipeline::assert_exactly_once(output, RECORDS, case);
}

/// The refused process's error: which typed error it names, and that it
/// names the owner's pid. Started at once, the refused process may read
/// the lock file before its owner has written who it is, and then says
/// "owner unknown"; a process started later always finds the pid.
fn assert_refused(refused: &Output, owner_pid: u32, start: Start, case: &str) {
    let stderr = text(&refused.stderr);
    assert!(
        !refused.status.success(),
        "{case}: the second process succeeded"
    );
    assert!(
        stderr.contains("is in use") && stderr.contains("by another process"),
        "{case}: the second process failed otherwise: {stderr}"
    );
    let named = stderr.contains(&format!("pid {owner_pid} "));
    let unknown_at_once = matches!(start, Start::AtOnce) && stderr.contains("owner unknown");
    assert!(
        named || unknown_at_once,
        "{case}: the error does not name the owner's pid {owner_pid}: {stderr}"
    );
}

fn check(shared: Shared, start: Start, parallelism: usize) {
    let case = format!("{shared:?}, {start:?}, parallelism {parallelism}");
    let dirs = Dirs::new(shared);
    let first = spawn(&mut runner(&dirs.stores[0], &dirs.output, parallelism));
    if let Start::AfterMs(delay_ms) = start {
        thread::sleep(Duration::from_millis(delay_ms));
    }
    let mut second = spawn(&mut runner(&dirs.stores[1], &dirs.output, parallelism));
    let (first_pid, second_pid) = (first.id(), second.id());
    // The refused process ends at once; the owner runs on.
    let refused_at = Instant::now();
    while second.try_wait().expect("waits").is_none() && refused_at.elapsed() < RUN_LIMIT {
        thread::sleep(Duration::from_millis(5));
    }
    let (first, second) = (wait(first, "the first"), wait(second, "the second"));
    // At once, either may win the lock.
    let (winner, loser, winner_pid) = match (first.status.success(), second.status.success()) {
        (true, false) => (first, second, first_pid),
        (false, true) => (second, first, second_pid),
        (true, true) => panic!(
            "{case}: both processes finished: {} / {}",
            text(&first.stdout),
            text(&second.stdout)
        ),
        (false, false) => panic!(
            "{case}: both processes failed: {} / {}",
            text(&first.stderr),
            text(&second.stderr)
        ),
    };
    if let Start::AfterMs(_) = start {
        assert_eq!(winner_pid, first_pid, "{case}: the later process won");
    }
    assert!(text(&winner.stdout).contains("done"), "{case}: no `done`");
    assert_refused(&loser, winner_pid, start, &case);
    let which = match shared {
        Shared::StoreAndOutput => "checkpoint store",
        Shared::Output => "output directory",
    };
    assert!(
        text(&loser.stderr).contains(which),
        "{case}: the refusal does not name the {which}: {}",
        text(&loser.stderr)
    );
    assert_exactly_once(&dirs.output, &case);
}

#[test]
fn two_processes_at_once_on_one_store() {
    check(Shared::StoreAndOutput, Start::AtOnce, 2);
}

#[test]
fn a_second_process_300_ms_later_on_one_store() {
    check(Shared::StoreAndOutput, Start::AfterMs(300), 1);
}

#[test]
fn a_second_process_on_its_own_store_and_the_same_output() {
    check(Shared::Output, Start::AfterMs(300), 3);
}

#[test]
fn two_processes_at_once_on_the_same_output() {
    check(Shared::Output, Start::AtOnce, 2);
}

/// A process killed with SIGKILL while it owns the store releases it with
/// its life: the next process on the same store and output resumes and
/// finishes exactly-once.
#[test]
fn a_killed_owner_leaves_no_lock() {
    let dirs = Dirs::new(Shared::StoreAndOutput);
    let first = spawn(&mut runner(&dirs.stores[0], &dirs.output, 2));
    thread::sleep(Duration::from_millis(400));
    kill(first);
    let resumed = wait(
        spawn(&mut runner(&dirs.stores[0], &dirs.output, 2)),
        "the resumed run",
    );
    assert!(
        resumed.status.success(),
        "the run after a SIGKILL failed: {}",
        text(&resumed.stderr)
    );
    assert_exactly_once(&dirs.output, "after a SIGKILL");
}
