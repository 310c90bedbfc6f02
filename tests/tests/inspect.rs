//! Reading checkpoints back through `snapflow::job::inspect`: the latest
//! checkpoint of a finished keyed job holds exactly the job's final keyed
//! state and source positions; every checkpoint of an unaligned job is a
//! consistent cut when its recorded channel states are counted in; a
//! custom operator's state reads back as its own type from every
//! checkpoint; a damaged part is a typed error, never a panic.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use snapflow::job::inspect::{CheckpointView, InspectError};
use snapflow::job::{Collector, Job, JobConfig, KeyedStateHandle, Operator, OperatorContext};
use snapflow::protocol::SnapshotMode;
use snapflow::runtime::BoxError;
use snapflow::sink::{CollectHandle, PendingTransactions};
use snapflow::source::split_range;
use snapflow::storage::{CheckpointStore, FsCheckpointStore, PartId, StoreOptions};
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};

const RECORDS: u64 = 2_000;
const KEYS: u64 = 23;
/// Slow enough that periodic checkpoints happen mid-stream.
const PACING: Pacing = Pacing {
    records_per_read: 32,
};

#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Count {
    seen: u64,
    sum: u64,
}

fn store(dir: &Path) -> Arc<FsCheckpointStore> {
    let options = StoreOptions {
        retained_checkpoints: 10_000,
    };
    Arc::new(FsCheckpointStore::open_with(dir, "inspect", options).expect("opens"))
}

fn config(store: &Arc<FsCheckpointStore>, parallelism: usize, mode: SnapshotMode) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(5),
        mode,
        default_parallelism: parallelism,
        batch_size_max: 16,
        arbiters: Some(2),
        store: Some(Arc::clone(store) as Arc<dyn CheckpointStore>),
        ..JobConfig::default()
    }
}

/// numbers → key_by n % KEYS → count → out. Returns the sink's output and
/// the final keyed state.
fn declare(
    job: &Job,
    source_parallelism: usize,
) -> (CollectHandle<(u64, u64)>, KeyedStateHandle<u64, Count>) {
    let output = CollectHandle::new();
    let (counted, state) = job
        .source("numbers", PacedSourceFactory::new(RECORDS, PACING))
        .parallelism(source_parallelism)
        .key_by(|n: &u64| n % KEYS)
        .process_with_state("count", |key: &u64, count: &mut Count, n: u64, out| {
            count.seen += 1;
            count.sum += n;
            out.emit((*key, count.seen));
            Ok(())
        });
    counted.sink("out", output.clone());
    (output, state)
}

fn check_latest(parallelism: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = store(dir.path());
    let job = Job::new(
        "inspect",
        config(&store, parallelism, SnapshotMode::Aligned),
    );
    let (output, state) = declare(&job, parallelism);
    job.run().expect("the job runs");

    let view = CheckpointView::latest(store.as_ref()).expect("a checkpoint");
    assert_eq!(
        view.operators(),
        ["count", "numbers", "out"],
        "every operator has parts"
    );
    let counts = view
        .keyed_state::<u64, Count>("count")
        .expect("keyed state decodes");
    assert_eq!(
        counts,
        state.snapshot(),
        "the checkpoint holds the final state"
    );
    assert_eq!(counts.len() as u64, KEYS);
    assert_eq!(
        counts.values().map(|count| count.seen).sum::<u64>(),
        RECORDS
    );
    let committed_per_key = committed_counts(&output.committed());
    let seen_per_key: HashMap<u64, u64> = counts
        .iter()
        .map(|(key, count)| (*key, count.seen))
        .collect();
    assert_eq!(seen_per_key, committed_per_key, "state and output agree");

    let positions = view.source_positions("numbers").expect("source parts");
    assert_eq!(positions.len(), parallelism);
    for (subtask, position) in positions.iter().enumerate() {
        let split = split_range(0..RECORDS, subtask, parallelism).expect("valid split");
        assert_eq!(position.to_index().expect("an index"), split.end);
    }
    for part in view.operator_parts("out").expect("sink parts") {
        PendingTransactions::decode(&part.sink_state()).expect("a collect sink's state");
    }
    let recorded = view.channel_records::<u64>("count").expect("decodes");
    assert!(recorded.is_empty(), "aligned checkpoints record no channel");

    // The same checkpoint read from its directory, as a moved savepoint.
    let dir_view = CheckpointView::open_dir(store.entry_dir(view.checkpoint(), view.kind()))
        .expect("the directory loads");
    assert_eq!(dir_view.checkpoint(), view.checkpoint());
    assert_eq!(
        dir_view.keyed_state::<u64, Count>("count").expect("keyed"),
        counts
    );
}

/// The highest count committed per key (counts are emitted 1, 2, 3, ...).
fn committed_counts(output: &[(u64, u64)]) -> HashMap<u64, u64> {
    let mut counts = HashMap::new();
    for &(key, count) in output {
        let highest = counts.entry(key).or_insert(0);
        *highest = count.max(*highest);
    }
    counts
}

#[test]
fn latest_checkpoint_at_parallelism_1() {
    check_latest(1);
}

#[test]
fn latest_checkpoint_at_parallelism_2() {
    check_latest(2);
}

#[test]
fn latest_checkpoint_at_parallelism_3() {
    check_latest(3);
}

/// Every checkpoint of an unaligned job: what the source read equals what
/// `count` counted plus what was recorded in flight on the way to it.
#[test]
fn unaligned_checkpoints_balance_with_their_channel_states() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = store(dir.path());
    let job = Job::new("inspect", config(&store, 2, SnapshotMode::Unaligned));
    job.source("numbers", PacedSourceFactory::new(RECORDS, PACING))
        .parallelism(1)
        .map("shift", |n: u64| n + 1)
        .key_by(|n: &u64| n % KEYS)
        .process("count", |_key: &u64, count: &mut Count, n: u64, out| {
            count.seen += 1;
            count.sum += n;
            out.emit(n);
            Ok(())
        })
        .sink("out", CollectHandle::new());
    job.run().expect("the job runs");

    let checkpoints = store.list().expect("lists");
    assert!(checkpoints.len() > 1, "checkpoints ran mid-stream");
    let mut recorded_total = 0;
    for summary in checkpoints {
        let view = CheckpointView::load(store.as_ref(), summary.checkpoint).expect("loads");
        let read = view.source_positions("numbers").expect("a source")[0]
            .to_index()
            .expect("an index");
        // Per key: the counted records plus those in flight towards
        // `count` (already shifted) and towards `shift` (not yet).
        let mut balance: HashMap<u64, u64> = view
            .keyed_state::<u64, Count>("count")
            .expect("keyed state")
            .into_iter()
            .map(|(key, count)| (key, count.seen))
            .collect();
        let to_shift = view.channel_records::<u64>("shift").expect("u64s");
        let to_count = view.channel_records::<u64>("count").expect("u64s");
        recorded_total += to_shift.len() + to_count.len();
        let shifted = to_shift.iter().map(|n| n + 1).chain(to_count);
        for n in shifted {
            *balance.entry(n % KEYS).or_insert(0) += 1;
        }
        balance.retain(|_, seen| *seen > 0);
        let mut expected: HashMap<u64, u64> = HashMap::new();
        for n in 0..read {
            *expected.entry((n + 1) % KEYS).or_insert(0) += 1;
        }
        assert_eq!(
            balance, expected,
            "checkpoint {}: state plus recorded records per key must equal the {read} records \
             the source had read",
            summary.checkpoint
        );
    }
    println!("records recorded in flight over all checkpoints: {recorded_total}");
}

fn finished_job(dir: &Path) -> Arc<FsCheckpointStore> {
    let store = store(dir);
    let job = Job::new("inspect", config(&store, 2, SnapshotMode::Aligned));
    let _ = declare(&job, 2);
    job.run().expect("the job runs");
    store
}

/// The files of `operator`'s parts under a checkpoint's directory.
fn part_files(dir: &Path, operator: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("a directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.to_string_lossy().contains(operator) {
                found.push(path);
            }
        }
    }
    found
}

#[test]
fn a_damaged_part_on_disk_is_a_store_error_and_latest_falls_back() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = finished_job(dir.path());
    let latest = CheckpointView::latest(store.as_ref()).expect("a checkpoint");
    let entry = store.entry_dir(latest.checkpoint(), latest.kind());
    let file = part_files(&entry, "count")
        .into_iter()
        .next()
        .expect("a part file of `count`");
    let mut bytes = std::fs::read(&file).expect("reads");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(&file, bytes).expect("writes");

    let error = CheckpointView::load(store.as_ref(), latest.checkpoint()).expect_err("damaged");
    assert!(matches!(error, InspectError::Store(_)), "{error}");
    assert!(!error.is_retryable());
    assert!(
        store.list().expect("lists").len() > 1,
        "checkpoints ran mid-stream"
    );
    let previous = CheckpointView::latest(store.as_ref()).expect("an older checkpoint");
    assert!(previous.checkpoint() < latest.checkpoint());
}

/// Bytes damaged before the store saw them (the store's checksums then
/// match): decoding still fails with a typed error.
fn check_damaged_bytes(damage: fn(&mut Vec<u8>), expected: fn(&InspectError) -> bool) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = finished_job(dir.path());
    let mut loaded = store
        .load_latest()
        .expect("loads")
        .checkpoint
        .expect("a checkpoint");
    let bytes = loaded
        .parts
        .get_mut(&PartId::new("count", 1))
        .expect("count has subtask 1");
    damage(bytes);
    let result = CheckpointView::from_loaded(loaded)
        .and_then(|view| view.keyed_state::<u64, Count>("count").map(|_| ()));
    let error = result.expect_err("damaged bytes do not decode");
    assert!(expected(&error), "unexpected error: {error:?}");
    assert!(!error.is_retryable());
}

#[test]
fn a_truncated_part_is_malformed() {
    check_damaged_bytes(
        |bytes| bytes.truncate(bytes.len() / 2),
        |error| matches!(error, InspectError::MalformedPart { .. }),
    );
}

#[test]
fn a_flipped_bit_in_keyed_state_is_a_keyed_error() {
    check_damaged_bytes(
        // The last bytes are the last key group's entries (the part's
        // channel list, empty, is the final byte).
        |bytes| {
            let index = bytes.len() - 3;
            bytes[index] ^= 0x01;
        },
        |error| matches!(error, InspectError::Keyed { .. }),
    );
}

#[test]
fn keyed_state_of_another_type_is_a_keyed_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = finished_job(dir.path());
    let view = CheckpointView::latest(store.as_ref()).expect("a checkpoint");
    #[derive(Snapshot, Debug, Default)]
    struct Other {
        name: String,
    }
    let error = view
        .keyed_state::<u64, Other>("count")
        .expect_err("another state type");
    assert!(matches!(error, InspectError::Keyed { .. }), "{error}");
    let error = view
        .keyed_state::<u64, Count>("nothing")
        .expect_err("no operator");
    assert!(matches!(error, InspectError::UnknownOperator { .. }));
}

/// A custom operator: counts and sums its subtask's records, emits
/// `(subtask, count, sum)` once its input ends.
#[derive(Snapshot, Debug, Default, PartialEq, Eq)]
struct Summer {
    count: u64,
    sum: u64,
    /// Not state: a checkpoint's instance reads back with the default.
    #[snapshot(skip)]
    subtask: usize,
}

impl Operator for Summer {
    type In = u64;
    type Out = (usize, u64, u64);

    fn on_record(&mut self, n: u64, _out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        self.count += 1;
        self.sum += n;
        Ok(())
    }

    fn on_end_of_input(&mut self, out: &mut Collector<'_, Self::Out>) -> Result<(), BoxError> {
        out.emit((self.subtask, self.count, self.sum));
        Ok(())
    }
}

/// Every checkpoint of a job with a custom operator behind a forward edge
/// holds, per subtask, exactly the records its source subtask had read;
/// the last one holds what the operator emitted at the end of its input.
#[test]
fn a_custom_operators_state_reads_back_from_every_checkpoint() {
    const PARALLELISM: usize = 2;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = store(dir.path());
    let job = Job::new(
        "inspect",
        config(&store, PARALLELISM, SnapshotMode::Aligned),
    );
    let output = CollectHandle::new();
    job.source("numbers", PacedSourceFactory::new(RECORDS, PACING))
        .forward()
        .operator("summer", |context: &OperatorContext| Summer {
            subtask: context.subtask,
            ..Summer::default()
        })
        .sink("out", output.clone());
    job.run().expect("the job runs");

    let checkpoints = store.list().expect("lists");
    assert!(checkpoints.len() > 1, "checkpoints ran mid-stream");
    for summary in &checkpoints {
        let view = CheckpointView::load(store.as_ref(), summary.checkpoint).expect("loads");
        let states = view.operator_states::<Summer>("summer").expect("decodes");
        let positions = view.source_positions("numbers").expect("a source");
        assert_eq!(states.len(), PARALLELISM);
        for (subtask, (state, position)) in states.iter().zip(&positions).enumerate() {
            let split = split_range(0..RECORDS, subtask, PARALLELISM).expect("valid split");
            let read = split.start..position.to_index().expect("an index");
            let expected = (read.end - read.start, read.sum::<u64>());
            assert_eq!(
                (state.count, state.sum),
                expected,
                "checkpoint {}, subtask {subtask}",
                summary.checkpoint
            );
            assert_eq!(state.subtask, 0, "a skipped field reads back as default");
        }
    }

    let latest = CheckpointView::latest(store.as_ref()).expect("a checkpoint");
    let mut emitted = output.committed();
    emitted.sort_unstable();
    let stored: Vec<(usize, u64, u64)> = latest
        .operator_states::<Summer>("summer")
        .expect("decodes")
        .into_iter()
        .enumerate()
        .map(|(subtask, state)| (subtask, state.count, state.sum))
        .collect();
    assert_eq!(
        stored, emitted,
        "the final checkpoint holds what was emitted"
    );
    for part in latest.operator_parts("summer").expect("parts") {
        assert!(part.operator_ended().expect("an operator's part"));
        // The plain reader names the one that works.
        let error = part.state::<Summer>().expect_err("an operator's part");
        assert!(
            matches!(error, InspectError::OperatorPart { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("operator_state"), "{error}");
    }
}

#[test]
fn an_operator_state_read_as_something_else_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = finished_job(dir.path());
    let view = CheckpointView::latest(store.as_ref()).expect("a checkpoint");
    // A keyed operator's part is not an operator's part.
    let error = view
        .operator_states::<Summer>("count")
        .expect_err("keyed state");
    assert!(
        matches!(
            error,
            InspectError::MalformedPart { .. } | InspectError::State { .. }
        ),
        "{error}"
    );
    // A source's position is shorter than an operator's header.
    let error = view
        .part("numbers", 0)
        .expect("a source part")
        .operator_state::<Summer>()
        .expect_err("a position");
    assert!(
        matches!(error, InspectError::MalformedPart { .. }),
        "{error}"
    );
}
