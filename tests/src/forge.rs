//! Forged checkpoint metadata, for the recovery tests: a job with one
//! operator of every kind a checkpoint holds a part of (a source, a
//! stateless map, a user operator with operator state, a keyed operator,
//! a keyed operator with timers, an exactly-once file sink), a store it
//! wrote, copies of that store, and seeded forgeries of the newest
//! checkpoint's `_metadata`, re-encoded with valid checksums so that
//! only the meaning of the metadata is wrong. The store lives in a
//! directory or on S3 ([`StoreKind`]), and is forged in place either way.
//!
//! It only prepares and forges; the tests resume the job and judge it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use snapflow::job::{
    Collector, Job, JobConfig, JobError, JobReport, Operator, OperatorContext, RestartStrategy,
};
use snapflow::runtime::BoxError;
use snapflow::sink::{Sink, SinkFactory};
use snapflow::storage::metadata::CheckpointMetadata;
use snapflow::storage::{
    CheckpointKind, CheckpointStore, FsCheckpointStore, PartId, PartInfo, SegmentSource,
};
use snapflow::Snapshot;

use crate::damage::{S3Prefix, StoreAt, StoreKind};
use crate::pipeline::{KeyTotals, PacedSourceFactory, Pacing, KEYS};
use crate::TestRng;

/// The job's name (its store directory derives from it).
pub const JOB: &str = "forged";
/// Every operator's parallelism.
pub const PARALLELISM: u32 = 2;
/// The job's max parallelism (the default).
pub const MAX_PARALLELISM: u32 = 128;

/// The operators, with the kind of part each writes.
pub const OPERATORS: [(&str, PartKind); 6] = [
    ("numbers", PartKind::Source),
    ("parse", PartKind::Stateless),
    ("tally", PartKind::OperatorState),
    ("count", PartKind::Keyed),
    ("timed", PartKind::Timed),
    ("collect", PartKind::Sink),
];

/// What an operator's part holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartKind {
    /// A source's position.
    Source,
    /// Nothing (a stateless operator still writes a part).
    Stateless,
    /// A user operator's own state.
    OperatorState,
    /// Keyed state.
    Keyed,
    /// Keyed state with timers.
    Timed,
    /// A sink's pending transactions.
    Sink,
}

const PACING: Pacing = Pacing {
    records_per_read: 40,
};

/// Counts what its subtask saw, passing every record on.
#[derive(Snapshot, Default)]
pub struct Tally {
    seen: u64,
}

impl Operator for Tally {
    type In = u64;
    type Out = u64;

    fn on_record(&mut self, id: u64, out: &mut Collector<'_, u64>) -> Result<(), BoxError> {
        self.seen += 1;
        out.emit(id);
        Ok(())
    }
}

/// The last count the timed operator saw for a key.
#[derive(Snapshot, Default, Clone)]
pub struct Last {
    count: u64,
}

/// Declares the job over records `0..records` into `sink`: `numbers` →
/// `parse` → `tally` → `count` (by key) → `timed` (by key) → `collect`.
/// The output is `(key, count)` per record, as
/// [`expected`] computes it.
pub fn declare<F>(job: &Job, records: u64, sink: F)
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    job.source("numbers", PacedSourceFactory::new(records, PACING))
        .map("parse", |id: u64| id)
        .operator("tally", |_: &OperatorContext| Tally::default())
        .key_by(|id: &u64| id % KEYS)
        .process(
            "count",
            |key: &u64, totals: &mut KeyTotals, id: u64, out| {
                totals.count += 1;
                totals.sum += id;
                out.emit((*key, totals.count));
                Ok(())
            },
        )
        .key_by(|&(key, _): &(u64, u64)| key)
        .process_with_timers(
            "timed",
            |_key: &u64, last: &mut Last, (key, count): (u64, u64), timers, out| {
                last.count = count;
                // Fires at the end of input (no event time): a timer in
                // every checkpoint's state.
                timers.register_event_time_ms(count);
                out.emit((key, count));
                Ok(())
            },
            |_key: &u64,
             _last: &mut Last,
             _at_ms: u64,
             _timers,
             _out: &mut Collector<'_, (u64, u64)>| { Ok(()) },
        )
        .sink("collect", sink);
}

/// The failure-free output, sorted.
pub fn expected(records: u64) -> Vec<(u64, u64)> {
    let mut counts = vec![0u64; KEYS as usize];
    let mut output: Vec<(u64, u64)> = (0..records)
        .map(|id| {
            let key = id % KEYS;
            counts[key as usize] += 1;
            (key, counts[key as usize])
        })
        .collect();
    output.sort_unstable();
    output
}

/// A job's checkpoint store and output directory.
#[derive(Debug, Clone)]
pub struct Dirs {
    /// The checkpoint store.
    pub store: StoreAt,
    /// The sink's output.
    pub output: PathBuf,
}

/// Where one checkpoint's files are: a directory, or the objects under a
/// key prefix.
#[derive(Debug, Clone)]
pub enum CheckpointAt {
    /// The checkpoint's directory.
    Dir(PathBuf),
    /// The checkpoint's key prefix (without a trailing `/`) in a bucket.
    Objects(S3Prefix, String),
}

impl CheckpointAt {
    /// The bytes of `relative` in the checkpoint.
    fn read(&self, relative: &str) -> Vec<u8> {
        match self {
            CheckpointAt::Dir(dir) => fs::read(dir.join(relative)).expect("the file reads"),
            CheckpointAt::Objects(s3, key) => s3
                .get(&format!("{key}/{relative}"))
                .expect("the object exists"),
        }
    }

    /// Writes `relative` in the checkpoint as a new file (never through a
    /// hard link) or object.
    fn write(&self, relative: &str, bytes: &[u8]) {
        match self {
            CheckpointAt::Dir(dir) => {
                let path = dir.join(relative);
                let _ = fs::remove_file(&path);
                fs::write(&path, bytes).expect("the file writes");
            }
            CheckpointAt::Objects(s3, key) => s3.put(&format!("{key}/{relative}"), bytes),
        }
    }

    /// Makes `to` in the checkpoint hold what `from` holds (a hard link,
    /// or a copy of the object); quietly nothing when `from` is missing.
    fn link(&self, from: &str, to: &str) {
        match self {
            CheckpointAt::Dir(dir) => {
                let target = dir.join(to);
                fs::create_dir_all(target.parent().expect("a parent"))
                    .expect("the operator directory");
                let _ = fs::hard_link(dir.join(from), target);
            }
            CheckpointAt::Objects(s3, key) => {
                let from = format!("{key}/{from}");
                if s3.get(&from).is_some() {
                    s3.copy(&from, &format!("{key}/{to}"));
                }
            }
        }
    }
}

impl Dirs {
    /// `store/` and `output/` under `root`.
    pub fn under(root: &Path) -> Dirs {
        Dirs::new(&StoreKind::Dir, root)
    }

    /// The store of `kind` (on S3, under a prefix no other case uses) and
    /// `output/` under `root`.
    pub fn new(kind: &StoreKind, root: &Path) -> Dirs {
        let store = match kind {
            StoreKind::Dir => StoreAt::Dir(root.join("store")),
            StoreKind::S3(bucket) => StoreAt::S3(bucket.unique("forged")),
        };
        Dirs {
            store,
            output: root.join("output"),
        }
    }

    /// The job's store, to list and load (on S3 without taking it over).
    pub fn reader(&self) -> Box<dyn CheckpointStore> {
        match &self.store {
            StoreAt::Dir(root) => {
                Box::new(FsCheckpointStore::open(root, JOB).expect("the store opens"))
            }
            StoreAt::S3(s3) => Box::new(s3.open_read_only(JOB)),
        }
    }

    /// The newest complete checkpoint's id.
    pub fn newest(&self) -> Option<u64> {
        let listed = self.reader().list().expect("the store lists");
        listed.last().map(|summary| summary.checkpoint)
    }

    /// Where checkpoint `checkpoint`'s files are.
    pub fn checkpoint_dir(&self, checkpoint: u64) -> CheckpointAt {
        let kind = CheckpointKind::Checkpoint;
        match &self.store {
            StoreAt::Dir(root) => CheckpointAt::Dir(
                FsCheckpointStore::open(root, JOB)
                    .expect("the store opens")
                    .entry_dir(checkpoint, kind),
            ),
            StoreAt::S3(s3) => {
                let dir = s3.open_read_only(JOB).entry_dir(checkpoint, kind);
                CheckpointAt::Objects(s3.clone(), s3.key_of(&dir))
            }
        }
    }

    /// Copies this job's store and output to `to`'s (on disk with hard
    /// links, on S3 by server-side copies).
    pub fn copy_to(&self, to: &Dirs) {
        match (&self.store, &to.store) {
            (StoreAt::Dir(from), StoreAt::Dir(into)) => copy_tree(from, into),
            (StoreAt::S3(from), StoreAt::S3(into)) => from.copy_all(into),
            _ => panic!("a copy between kinds of store"),
        }
        copy_tree(&self.output, &to.output);
    }
}

/// The configuration of every run: 15 ms checkpoints on the store, every
/// operator at [`PARALLELISM`].
pub fn config(dirs: &Dirs, restart: RestartStrategy) -> JobConfig {
    let config = JobConfig {
        checkpoint_interval_ms: Some(15),
        default_parallelism: PARALLELISM as usize,
        max_parallelism: MAX_PARALLELISM,
        restart,
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

/// Runs the job on `dirs` into `sink`, failing the test if it takes
/// longer than `limit` (a hang).
pub fn run<F>(
    dirs: &Dirs,
    records: u64,
    restart: RestartStrategy,
    limit: Duration,
    sink: F,
) -> Result<JobReport, JobError>
where
    F: SinkFactory + Send + Sync + 'static,
    F::Sink: Sink<Item = (u64, u64)> + 'static,
{
    let (sender, receiver) = mpsc::channel();
    let config = config(dirs, restart);
    thread::spawn(move || {
        let job = Job::new(JOB, config);
        declare(&job, records, sink);
        // The receiver may have given up on a hang already.
        let _ = sender.send(job.run());
    });
    receiver
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the job did not end within {limit:?}"))
}

/// Copies the directory tree `from` to `to`: `_metadata` files are
/// copied, every other file is hard-linked (neither the job nor a
/// forgery ever writes into an existing file: they write a new one and
/// rename it), so a copy of a store costs little.
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("the copy's directory");
    for entry in fs::read_dir(from).expect("the directory reads").flatten() {
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        if source.is_dir() {
            copy_tree(&source, &target);
        } else if entry.file_name() == "_metadata" {
            fs::copy(&source, &target).expect("the metadata copies");
        } else {
            fs::hard_link(&source, &target).expect("the file links");
        }
    }
}

/// Reads checkpoint `at`'s metadata.
pub fn read_metadata(at: &CheckpointAt) -> CheckpointMetadata {
    CheckpointMetadata::decode(&at.read("_metadata")).expect("the metadata decodes")
}

/// Replaces checkpoint `at`'s metadata with `metadata`, encoded with
/// valid checksums. Parts are not re-sorted: a forgery may unsort them.
pub fn write_metadata(at: &CheckpointAt, metadata: &CheckpointMetadata) {
    let bytes = metadata.encode().expect("the forged metadata encodes");
    at.write("_metadata", &bytes);
}

/// The operator an index of [`OPERATORS`] names.
fn operator(index: usize) -> (&'static str, PartKind) {
    OPERATORS[index % OPERATORS.len()]
}

/// A stateful operator (one whose parts are never empty).
fn stateful(rng: &mut TestRng) -> &'static str {
    let stateful: Vec<&str> = OPERATORS
        .iter()
        .filter(|(_, kind)| *kind != PartKind::Stateless)
        .map(|(name, _)| *name)
        .collect();
    stateful[rng.between(0, stateful.len() as u64 - 1) as usize]
}

/// A number that is not `avoid`, from the edges and the middle.
fn hostile_u32(rng: &mut TestRng, avoid: u32) -> u32 {
    let candidates = [
        0,
        1,
        avoid.wrapping_sub(1),
        avoid.wrapping_add(1),
        MAX_PARALLELISM + 1,
        1 << 15,
        (1 << 15) + 1,
        u32::MAX - 1,
        u32::MAX,
        rng.next_u64() as u32,
    ];
    let pick = candidates[rng.between(0, candidates.len() as u64 - 1) as usize];
    if pick == avoid {
        u32::MAX
    } else {
        pick
    }
}

/// Links part `from` of checkpoint `at` as part `to`, so that the store
/// finds a file for a forged part; returns its info.
fn link_part(
    at: &CheckpointAt,
    metadata: &CheckpointMetadata,
    from: &PartId,
    to: &PartId,
) -> PartInfo {
    let info = metadata
        .parts
        .iter()
        .find(|info| info.part == *from)
        .expect("the part exists")
        .clone();
    let file = |part: &PartId| format!("op-{}/{}.part", part.operator, part.subtask);
    // A segmented part's own file is only part of its bytes; the store
    // then finds the forged part damaged, which is fine too.
    at.link(&file(from), &file(to));
    PartInfo {
        part: to.clone(),
        ..info
    }
}

/// Forges `metadata` of the checkpoint at `at` one way, drawn from
/// `rng`; returns what it did. Every forgery makes the metadata wrong for
/// the job (see `recovery_forged.rs`): none describes a checkpoint the
/// job could restore.
pub fn forge(rng: &mut TestRng, at: &CheckpointAt, metadata: &mut CheckpointMetadata) -> String {
    let layout = &mut metadata.key_groups;
    match rng.between(0, 13) {
        0..=2 => {
            let (name, kind) = operator(rng.between(0, 5) as usize);
            let part = PartId::new(name, rng.between(0, u64::from(PARALLELISM) - 1) as u32);
            metadata.parts.retain(|info| info.part != part);
            metadata.segments.remove(&part);
            format!("the part {part} ({kind:?}) is missing")
        }
        3 | 4 => {
            let (name, kind) = operator(rng.between(0, 5) as usize);
            let parallelism = hostile_u32(rng, PARALLELISM);
            layout.operator_parallelism.insert(name.into(), parallelism);
            format!("{name} ({kind:?}) has parallelism {parallelism}")
        }
        5 => {
            let max = hostile_u32(rng, MAX_PARALLELISM);
            layout.max_parallelism = max;
            format!("the max parallelism is {max}")
        }
        6 => {
            let index = rng.between(0, metadata.parts.len() as u64 - 1) as usize;
            let size = metadata.parts[index].size_bytes;
            let forged = [
                0,
                size.saturating_sub(1),
                size + 1,
                size * 2 + 1,
                1 << 40,
                u64::MAX,
            ][rng.between(0, 5) as usize];
            let forged = if forged == size { size + 1 } else { forged };
            metadata.parts[index].size_bytes = forged;
            format!(
                "{} is {forged} bytes, not {size}",
                metadata.parts[index].part
            )
        }
        7 => {
            let index = rng.between(0, metadata.parts.len() as u64 - 1) as usize;
            let twin = metadata.parts[index].clone();
            metadata.parts.insert(index, twin.clone());
            format!("{} is listed twice", twin.part)
        }
        8 => {
            let parallelism = [1, 2, 3, u32::MAX][rng.between(0, 3) as usize];
            let source = stateful(rng);
            layout
                .operator_parallelism
                .insert("ghost".into(), parallelism);
            let linked = rng.between(0, 2);
            for subtask in 0..linked.min(u64::from(parallelism)) as u32 {
                let info = link_part(
                    at,
                    metadata,
                    &PartId::new(source, subtask),
                    &PartId::new("ghost", subtask),
                );
                metadata.parts.push(info);
            }
            metadata.parts.sort_by(|a, b| a.part.cmp(&b.part));
            let role = rng.chance(30);
            if role {
                metadata
                    .user
                    .insert("snapflow.role.ghost".into(), "source".into());
            }
            format!(
                "an unknown operator `ghost` at parallelism {parallelism} with {linked} parts \
                 linked from {source}{}",
                if role { " and a role" } else { "" }
            )
        }
        9 => {
            let source = stateful(rng);
            let beyond = [PARALLELISM, PARALLELISM + 1, u32::MAX][rng.between(0, 2) as usize];
            let info = link_part(
                at,
                metadata,
                &PartId::new(source, 0),
                &PartId::new(source, beyond),
            );
            metadata.parts.push(info);
            metadata.parts.sort_by(|a, b| a.part.cmp(&b.part));
            format!("a part {source}[{beyond}] beyond the parallelism")
        }
        10 => {
            // The operator leaves the layout; with its parts only when it
            // has a role that still names it.
            let (name, kind) = operator(rng.between(0, 5) as usize);
            layout.operator_parallelism.remove(name);
            let with_parts = matches!(kind, PartKind::Source | PartKind::Sink) && rng.chance(50);
            if with_parts {
                metadata.parts.retain(|info| info.part.operator != name);
                metadata.segments.retain(|part, _| part.operator != name);
            }
            format!(
                "{name} ({kind:?}) is not in the layout{}",
                if with_parts { ", nor its parts" } else { "" }
            )
        }
        11 => {
            let part = match rng.between(0, 2) {
                0 => PartId::new("numbers", PARALLELISM),
                1 => PartId::new("numbers", u32::MAX),
                _ => PartId::new("ghost", 0),
            };
            metadata.source_positions.insert(part.clone(), vec![0; 8]);
            format!("a source position of {part}")
        }
        12 => {
            if rng.chance(50) {
                metadata.checkpoint += 1 + rng.between(0, 3);
                format!("it names checkpoint {}", metadata.checkpoint)
            } else {
                metadata.job = "another".into();
                "it names another job".to_string()
            }
        }
        _ => forge_segments(rng, metadata),
    }
}

/// Forges the segments of a segmented part (incremental checkpoints), or
/// a role when no part is segmented.
fn forge_segments(rng: &mut TestRng, metadata: &mut CheckpointMetadata) -> String {
    let checkpoint = metadata.checkpoint;
    let parts: Vec<PartId> = metadata.segments.keys().cloned().collect();
    if parts.is_empty() {
        metadata
            .user
            .insert("snapflow.role.ghost".into(), "sink".into());
        return "a role of an unknown operator".to_string();
    }
    let part = parts[rng.between(0, parts.len() as u64 - 1) as usize].clone();
    let segments = metadata.segments.get_mut(&part).expect("listed");
    let index = rng.between(0, segments.len() as u64 - 1) as usize;
    let segment = &mut segments[index];
    match rng.between(0, 3) {
        0 => {
            segment.len = segment.len.saturating_add(1 + rng.between(0, 1 << 20));
            format!("segment {index} of {part} is longer")
        }
        1 => {
            segment.offset = segment
                .offset
                .saturating_add(1 + rng.between(0, u64::MAX / 2));
            format!("segment {index} of {part} starts beyond its file")
        }
        2 => {
            segment.source = SegmentSource::Shared(checkpoint + 1);
            format!("segment {index} of {part} refers to a later checkpoint")
        }
        _ => {
            segment.crc32 ^= 1 << rng.between(0, 31);
            format!("segment {index} of {part} has another CRC-32")
        }
    }
}
