//! Damage to a job's files, for the recovery tests: a run of the standard
//! pipeline that crashes just before or just after a sink commit (so the
//! newest checkpoint's output is staged, or already visible), the list of
//! files a checkpoint and the sink's staging area hold, and seeded damage
//! to one of them (a flipped byte, a cut, a deletion). The checkpoints
//! live in a directory or on S3 ([`StoreKind`]); the sink's output is
//! always on disk.
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
pub use crate::s3_objects::S3Prefix;
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

/// Where a job's checkpoints live: the harness runs the same cases on
/// either.
#[derive(Debug, Clone)]
pub enum StoreKind {
    /// A directory under each case's temporary directory.
    Dir,
    /// A unique prefix per case in this bucket of the test S3 server.
    S3(S3Prefix),
}

/// Where one job's checkpoints live.
#[derive(Debug, Clone)]
pub enum StoreAt {
    /// The file store's root.
    Dir(PathBuf),
    /// The object store's location.
    S3(S3Prefix),
}

/// A job's checkpoint store and output directory.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// The checkpoint store.
    pub store: StoreAt,
    /// The sink's output.
    pub output: PathBuf,
}

impl Dirs {
    /// `store/` and `output/` under `root`.
    pub fn under(root: &Path) -> Dirs {
        Dirs {
            store: StoreAt::Dir(root.join("store")),
            output: root.join("output"),
        }
    }

    /// The store of `kind` (on S3, under a prefix no other case uses) and
    /// `output/` under `root`.
    pub fn new(kind: &StoreKind, root: &Path) -> Dirs {
        match kind {
            StoreKind::Dir => Dirs::under(root),
            StoreKind::S3(bucket) => Dirs {
                store: StoreAt::S3(bucket.unique("damage")),
                output: root.join("output"),
            },
        }
    }

    /// The job's store, on a directory (the tests that reach into its
    /// files use it).
    pub fn open_store(&self) -> FsCheckpointStore {
        match &self.store {
            StoreAt::Dir(root) => FsCheckpointStore::open(root, JOB).expect("the store opens"),
            StoreAt::S3(_) => panic!("the store is on S3, not in a directory"),
        }
    }

    /// The job's store, to list and load (on S3 without taking it over).
    pub fn reader(&self) -> Box<dyn CheckpointStore> {
        match &self.store {
            StoreAt::Dir(_) => Box::new(self.open_store()),
            StoreAt::S3(s3) => Box::new(s3.open_read_only(JOB)),
        }
    }

    /// Every file or object of checkpoint `checkpoint`, sorted.
    fn checkpoint_places(&self, checkpoint: u64) -> Vec<Place> {
        let kind = CheckpointKind::Checkpoint;
        match &self.store {
            StoreAt::Dir(_) => files_in(&self.open_store().entry_dir(checkpoint, kind))
                .into_iter()
                .map(Place::File)
                .collect(),
            StoreAt::S3(s3) => {
                let dir = s3.open_read_only(JOB).entry_dir(checkpoint, kind);
                s3.list(&s3.key_of(&dir))
                    .into_iter()
                    .map(|key| Place::Object(s3.clone(), key))
                    .collect()
            }
        }
    }
}

/// The configuration of every run: 15 ms checkpoints on the store.
pub fn config(dirs: &Dirs, restart: RestartStrategy, accept_duplicates: bool) -> JobConfig {
    let config = JobConfig {
        checkpoint_interval_ms: Some(15),
        restart,
        accept_duplicates_after_fallback: accept_duplicates,
        ..JobConfig::default()
    };
    match &dirs.store {
        StoreAt::Dir(root) => config.with_store_dir(root, JOB).expect("the store opens"),
        StoreAt::S3(s3) => JobConfig {
            store: Some(Arc::new(s3.open(JOB).expect("the store opens"))),
            ..config
        },
    }
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

/// A file of a job's: on disk, or an object on S3.
#[derive(Debug, Clone)]
pub enum Place {
    /// A file.
    File(PathBuf),
    /// The object with this key in the prefix's bucket.
    Object(S3Prefix, String),
}

impl Place {
    /// Its bytes.
    fn read(&self) -> Vec<u8> {
        match self {
            Place::File(path) => fs::read(path).expect("the damaged file reads"),
            Place::Object(s3, key) => s3.get(key).expect("the damaged object exists"),
        }
    }

    /// Replaces its bytes.
    fn write(&self, bytes: &[u8]) {
        match self {
            Place::File(path) => fs::write(path, bytes).expect("the file is rewritten"),
            Place::Object(s3, key) => s3.put(key, bytes),
        }
    }

    /// Removes it.
    fn remove(&self) {
        match self {
            Place::File(path) => fs::remove_file(path).expect("the file is removed"),
            Place::Object(s3, key) => s3.delete(key),
        }
    }

    /// Whether it is a checkpoint's `_metadata`.
    fn is_metadata(&self) -> bool {
        match self {
            Place::File(path) => path.file_name().is_some_and(|name| name == "_metadata"),
            Place::Object(_, key) => key.ends_with("/_metadata"),
        }
    }

    /// Whether it is a checkpoint's part.
    fn is_part(&self) -> bool {
        match self {
            Place::File(path) => path
                .extension()
                .is_some_and(|extension| extension == "part"),
            Place::Object(_, key) => key.ends_with(".part"),
        }
    }
}

impl std::fmt::Display for Place {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Place::File(path) => write!(formatter, "{}", path.display()),
            Place::Object(s3, key) => write!(formatter, "s3://{}/{key}", s3.bucket),
        }
    }
}

/// One planned damage.
#[derive(Debug, Clone)]
pub struct Damage {
    /// What was damaged.
    pub target: Target,
    /// How.
    pub harm: Harm,
    /// The file or object.
    pub place: Place,
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
    dirs.reader()
        .list()
        .expect("the store lists")
        .iter()
        .map(|summary| summary.checkpoint)
        .collect()
}

/// The candidates for damage after a crash run: (kind, file or object).
/// On S3 the same kinds exist as on disk: an object can be rewritten
/// flipped or cut, or deleted, behind the store's back (a crash cannot
/// tear a PUT, but a bad writer or a bit rot can leave such bytes).
pub fn candidates(dirs: &Dirs) -> Option<(u64, Vec<(Target, Place)>)> {
    let ids = checkpoint_ids(dirs);
    let newest = *ids.last()?;
    let mut found = Vec::new();
    for place in dirs.checkpoint_places(newest) {
        let target = if place.is_metadata() {
            Target::NewestMetadata
        } else {
            Target::NewestPart
        };
        found.push((target, place));
    }
    if let Some(older) = ids.iter().rev().nth(1) {
        for place in dirs.checkpoint_places(*older) {
            if place.is_part() {
                found.push((Target::OlderPart, place));
            }
        }
    }
    // The sink's owner lock (`<prefix>.lock`) holds no output.
    for path in files_in(&dirs.output.join(".pending")) {
        if path.extension() != Some(std::ffi::OsStr::new("lock")) {
            found.push((Target::Staged, Place::File(path)));
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
    let (target, place) = candidates[rng.between(0, candidates.len() as u64 - 1) as usize].clone();
    let harm = [Harm::Flip, Harm::Truncate, Harm::Delete][rng.between(0, 2) as usize];
    apply_to(&place, harm, rng);
    Some(Damage {
        target,
        harm,
        place,
        newest,
    })
}

/// Damages one file. An empty file can only be deleted.
pub fn apply(path: &Path, harm: Harm, rng: &mut TestRng) {
    apply_to(&Place::File(path.to_path_buf()), harm, rng);
}

/// Damages one file or object. An empty one can only be deleted.
pub fn apply_to(place: &Place, harm: Harm, rng: &mut TestRng) {
    let mut bytes = place.read();
    match harm {
        Harm::Delete => place.remove(),
        _ if bytes.is_empty() => place.remove(),
        Harm::Flip => {
            let at = rng.between(0, bytes.len() as u64 - 1) as usize;
            bytes[at] ^= 1 << rng.between(0, 7);
            place.write(&bytes);
        }
        Harm::Truncate => {
            bytes.truncate(rng.between(0, bytes.len() as u64 - 1) as usize);
            place.write(&bytes);
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
    match newest_place(dirs, newest, target, operator) {
        Place::File(path) => path,
        Place::Object(..) => panic!("the store is on S3, not in a directory"),
    }
}

/// [`newest_file`] wherever the store is: on S3, the object of that name.
pub fn newest_place(dirs: &Dirs, newest: u64, target: Target, operator: &str) -> Place {
    let in_checkpoint = match target {
        Target::NewestMetadata => "_metadata".to_string(),
        Target::NewestPart | Target::OlderPart => format!("op-{operator}/0.part"),
        Target::Staged => {
            let staged = format!("part-0-{newest}.part");
            return Place::File(dirs.output.join(".pending").join(staged));
        }
    };
    let kind = CheckpointKind::Checkpoint;
    match &dirs.store {
        StoreAt::Dir(_) => Place::File(
            dirs.open_store()
                .entry_dir(newest, kind)
                .join(in_checkpoint),
        ),
        StoreAt::S3(s3) => {
            let dir = s3.open_read_only(JOB).entry_dir(newest, kind);
            Place::Object(s3.clone(), format!("{}/{in_checkpoint}", s3.key_of(&dir)))
        }
    }
}
