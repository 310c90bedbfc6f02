//! Damage to a job's files, for the recovery tests: a run of the standard
//! pipeline that crashes just before or just after a sink commit (so the
//! newest checkpoint's output is staged, or already visible), the list of
//! files a checkpoint and the sink's staging area hold, and seeded damage
//! to one of them (a flipped byte, a cut, a deletion).
//!
//! It only prepares and damages; the tests resume the job and judge the
//! outcome.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use snapflow::job::{Job, JobConfig, JobError, JobReport, RestartStrategy};
use snapflow::sink::{
    FileSink, FileSinkFactory, Sink, SinkError, SinkFactory, SinkState, Visibility,
};
use snapflow::storage::{CheckpointKind, CheckpointStore, FsCheckpointStore};

use crate::pipeline::{declare, Pacing, Shape};
use crate::{Faults, TestRng};

/// The records of every run.
pub const RECORDS: u64 = 3_000;
/// The job's name (its store directory derives from it).
pub const JOB: &str = "damage";
/// The shape: two sink subtasks, so a crash can fall between their
/// commits.
pub const SHAPE: Shape = [1, 2, 1, 2, 1, 2];

type Encode = fn(&(u64, u64), &mut Vec<u8>);

fn encode(record: &(u64, u64), out: &mut Vec<u8>) {
    out.extend_from_slice(format!("{} {}\n", record.0, record.1).as_bytes());
}

/// The plain sink of the pipeline: lines `key count`, no fsync (the page
/// cache outlives the in-process "crash").
pub fn line_sink(output: &Path) -> FileSinkFactory<(u64, u64), Encode> {
    FileSinkFactory::new(output, encode as Encode)
        .expect("the output directory")
        .fsync(false)
}

/// Where the first run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The `n`-th commit call (over both subtasks) fails before it makes
    /// anything visible: the newest checkpoint's output stays staged.
    BeforeCommit(u64),
    /// After `n` commit calls, the next write fails: the newest
    /// checkpoint's output is visible.
    AfterCommit(u64),
}

/// The file sink with a crash planted.
pub struct CrashingSink {
    inner: FileSinkFactory<(u64, u64), Encode>,
    crash: Crash,
    commits: Arc<AtomicU64>,
}

impl CrashingSink {
    /// `inner` with `crash` planted.
    pub fn new(inner: FileSinkFactory<(u64, u64), Encode>, crash: Crash) -> CrashingSink {
        CrashingSink {
            inner,
            crash,
            commits: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl SinkFactory for CrashingSink {
    type Sink = Crashing;

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Crashing, SinkError> {
        Ok(Crashing {
            inner: self.inner.create(subtask, parallelism)?,
            crash: self.crash,
            commits: Arc::clone(&self.commits),
        })
    }
}

/// One subtask of [`CrashingSink`].
pub struct Crashing {
    inner: FileSink<(u64, u64), Encode>,
    crash: Crash,
    commits: Arc<AtomicU64>,
}

fn crash(what: &str) -> SinkError {
    SinkError::Custom {
        message: format!("injected crash {what}"),
        retryable: true,
    }
}

impl Sink for Crashing {
    type Item = (u64, u64);

    fn write_batch(&mut self, batch: &[(u64, u64)]) -> Result<(), SinkError> {
        if let Crash::AfterCommit(after) = self.crash {
            if self.commits.load(Ordering::SeqCst) >= after {
                return Err(crash("after a commit"));
            }
        }
        self.inner.write_batch(batch)
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.inner.pre_commit(checkpoint_id)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        let call = self.commits.fetch_add(1, Ordering::SeqCst) + 1;
        if matches!(self.crash, Crash::BeforeCommit(at) if call >= at) {
            return Err(crash("before a commit"));
        }
        self.inner.commit(checkpoint_id)
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.inner.abort()
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.inner.restore(state)
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        self.inner.check_restore(restored, state)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.inner.finish()
    }
}

/// A job's two directories.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// The checkpoint store's root.
    pub store: PathBuf,
    /// The sink's output.
    pub output: PathBuf,
}

impl Dirs {
    /// `store/` and `output/` under `root`.
    pub fn under(root: &Path) -> Dirs {
        Dirs {
            store: root.join("store"),
            output: root.join("output"),
        }
    }

    /// The job's store.
    pub fn open_store(&self) -> FsCheckpointStore {
        FsCheckpointStore::open(&self.store, JOB).expect("the store opens")
    }
}

/// The configuration of every run: 15 ms checkpoints on the store.
pub fn config(dirs: &Dirs, restart: RestartStrategy, accept_duplicates: bool) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(15),
        restart,
        accept_duplicates_after_fallback: accept_duplicates,
        ..JobConfig::default()
    }
    .with_store_dir(&dirs.store, JOB)
    .expect("the store opens")
}

const PACING: Pacing = Pacing {
    records_per_read: 40,
};

/// Runs the pipeline until the planted crash (or its end), with no
/// restarts. The result is whatever the run ended with.
pub fn crash_run(dirs: &Dirs, crash: Crash) -> Result<JobReport, JobError> {
    let job = Job::new(JOB, config(dirs, RestartStrategy::None, false));
    let sink = CrashingSink::new(line_sink(&dirs.output), crash);
    declare(&job, RECORDS, SHAPE, PACING, &Faults::none(), sink);
    job.run()
}

/// Runs the pipeline to its end on the same directories, failing the test
/// if it takes longer than `limit` (a hang).
pub fn resume(
    dirs: &Dirs,
    accept_duplicates: bool,
    limit: Duration,
) -> Result<JobReport, JobError> {
    resume_with(dirs, accept_duplicates, limit, line_sink)
}

/// [`resume`] with the sink declaring replays harmless.
pub fn resume_replay_safe(dirs: &Dirs, limit: Duration) -> Result<JobReport, JobError> {
    resume_with(dirs, false, limit, |output| ReplaySafe(line_sink(output)))
}

/// [`resume`] into the sink `make_sink` builds on the output directory.
fn resume_with<F>(
    dirs: &Dirs,
    accept_duplicates: bool,
    limit: Duration,
    make_sink: fn(&Path) -> F,
) -> Result<JobReport, JobError>
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    let (sender, receiver) = mpsc::channel();
    let config = config(dirs, RestartStrategy::default(), accept_duplicates);
    let output = dirs.output.clone();
    thread::spawn(move || {
        let job = Job::new(JOB, config);
        declare(
            &job,
            RECORDS,
            SHAPE,
            PACING,
            &Faults::none(),
            make_sink(&output),
        );
        // The receiver may have given up on a hang already.
        let _ = sender.send(job.run());
    });
    receiver
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the resumed job did not end within {limit:?}"))
}

/// The file sink, declaring that a replay is harmless (as an upserting
/// sink would): its check still verifies staged files, then answers
/// [`Visibility::ReplayIsHarmless`].
pub struct ReplaySafe(FileSinkFactory<(u64, u64), Encode>);

impl SinkFactory for ReplaySafe {
    type Sink = ReplaySafeSink;

    fn create(&self, subtask: usize, parallelism: usize) -> Result<ReplaySafeSink, SinkError> {
        Ok(ReplaySafeSink(self.0.create(subtask, parallelism)?))
    }
}

/// One subtask of [`ReplaySafe`].
pub struct ReplaySafeSink(FileSink<(u64, u64), Encode>);

impl Sink for ReplaySafeSink {
    type Item = (u64, u64);

    fn write_batch(&mut self, batch: &[(u64, u64)]) -> Result<(), SinkError> {
        self.0.write_batch(batch)
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.0.pre_commit(checkpoint_id)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        self.0.commit(checkpoint_id)
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.0.abort()
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.0.restore(state)
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        self.0.check_restore(restored, state)?;
        Ok(Visibility::ReplayIsHarmless)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.0.finish()
    }
}

/// What a damage does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harm {
    /// XOR one byte.
    Flip,
    /// Cut the file shorter.
    Truncate,
    /// Remove the file.
    Delete,
}

/// The kind of a damaged file, for the tests' expectations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// `_metadata` of the newest checkpoint.
    NewestMetadata,
    /// A part of the newest checkpoint.
    NewestPart,
    /// A part of an older checkpoint.
    OlderPart,
    /// A file in the sink's `.pending` directory.
    Staged,
}

/// One planned damage.
#[derive(Debug, Clone)]
pub struct Damage {
    /// What was damaged.
    pub target: Target,
    /// How.
    pub harm: Harm,
    /// The file.
    pub path: PathBuf,
    /// The newest complete checkpoint before the damage.
    pub newest: u64,
}

/// Every file in `dir`, recursively, sorted.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return files;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_in(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The ids of the complete checkpoints, ascending.
pub fn checkpoint_ids(dirs: &Dirs) -> Vec<u64> {
    let store = dirs.open_store();
    store
        .list()
        .expect("the store lists")
        .iter()
        .map(|summary| summary.checkpoint)
        .collect()
}

/// The candidates for damage after a crash run: (kind, file).
pub fn candidates(dirs: &Dirs) -> Option<(u64, Vec<(Target, PathBuf)>)> {
    let ids = checkpoint_ids(dirs);
    let newest = *ids.last()?;
    let store = dirs.open_store();
    let newest_dir = store.entry_dir(newest, CheckpointKind::Checkpoint);
    let mut found = Vec::new();
    for path in files_in(&newest_dir) {
        let target = if path.file_name().is_some_and(|name| name == "_metadata") {
            Target::NewestMetadata
        } else {
            Target::NewestPart
        };
        found.push((target, path));
    }
    if let Some(older) = ids.iter().rev().nth(1) {
        let older_dir = store.entry_dir(*older, CheckpointKind::Checkpoint);
        for path in files_in(&older_dir) {
            if path
                .extension()
                .is_some_and(|extension| extension == "part")
            {
                found.push((Target::OlderPart, path));
            }
        }
    }
    // The sink's owner lock (`<prefix>.lock`) holds no output.
    for path in files_in(&dirs.output.join(".pending")) {
        if path.extension() != Some(std::ffi::OsStr::new("lock")) {
            found.push((Target::Staged, path));
        }
    }
    Some((newest, found))
}

/// Picks a file and a harm by `rng` and applies it.
pub fn damage(dirs: &Dirs, rng: &mut TestRng) -> Option<Damage> {
    let (newest, candidates) = candidates(dirs)?;
    if candidates.is_empty() {
        return None;
    }
    let (target, path) = candidates[rng.between(0, candidates.len() as u64 - 1) as usize].clone();
    let harm = [Harm::Flip, Harm::Truncate, Harm::Delete][rng.between(0, 2) as usize];
    apply(&path, harm, rng);
    Some(Damage {
        target,
        harm,
        path,
        newest,
    })
}

/// Damages one file. An empty file can only be deleted.
pub fn apply(path: &Path, harm: Harm, rng: &mut TestRng) {
    let mut bytes = fs::read(path).expect("the damaged file reads");
    match harm {
        Harm::Delete => fs::remove_file(path).expect("the file is removed"),
        _ if bytes.is_empty() => fs::remove_file(path).expect("the file is removed"),
        Harm::Flip => {
            let at = rng.between(0, bytes.len() as u64 - 1) as usize;
            bytes[at] ^= 1 << rng.between(0, 7);
            fs::write(path, bytes).expect("the file is rewritten");
        }
        Harm::Truncate => {
            bytes.truncate(rng.between(0, bytes.len() as u64 - 1) as usize);
            fs::write(path, bytes).expect("the file is rewritten");
        }
    }
}

/// The checkpoint ids of the sink's committed files, ascending, unique.
pub fn committed_checkpoints(dirs: &Dirs) -> Vec<u64> {
    committed_checkpoints_in(&dirs.output)
}

/// [`committed_checkpoints`] of the file sink writing into `output`.
pub fn committed_checkpoints_in(output: &Path) -> Vec<u64> {
    let files = snapflow::sink::committed_files(output, snapflow::sink::DEFAULT_PREFIX)
        .expect("the output lists");
    let mut ids: Vec<u64> = files
        .iter()
        .filter_map(|path| path.file_name()?.to_str()?.rsplit('-').next()?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The path of one file of the newest checkpoint (`_metadata`, or the
/// part of `operator`'s subtask 0), or of its staged sink file.
pub fn newest_file(dirs: &Dirs, newest: u64, target: Target, operator: &str) -> PathBuf {
    let store = dirs.open_store();
    let dir = store.entry_dir(newest, CheckpointKind::Checkpoint);
    match target {
        Target::NewestMetadata => dir.join("_metadata"),
        Target::NewestPart | Target::OlderPart => dir.join(format!("op-{operator}")).join("0.part"),
        Target::Staged => dirs
            .output
            .join(".pending")
            .join(format!("part-0-{newest}.part")),
    }
}
