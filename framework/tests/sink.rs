//! Tests of the built-in sinks through the public `Sink` trait: what each
//! step of two-phase commit leaves on disk or in the handle, idempotence,
//! rollback on restore, and the typed errors for bad names, bad state and
//! misuse.

use std::fs;
use std::path::{Path, PathBuf};

use proptest::prelude::*;
use snapflow::sink::{
    committed_files, CollectHandle, FileSinkFactory, Guarantee, PendingTransactions, PrintSink,
    Sink, SinkError, SinkFactory, SinkState, Visibility,
};

type LineSink = snapflow::sink::FileSink<u32, fn(&u32, &mut Vec<u8>)>;

fn factory(dir: &Path) -> FileSinkFactory<u32, fn(&u32, &mut Vec<u8>)> {
    FileSinkFactory::lines(dir).expect("factory")
}

fn new_sink(dir: &Path, subtask: usize, state: Option<&SinkState>) -> LineSink {
    let mut sink = factory(dir).create(subtask, 4).expect("create");
    sink.restore(state).expect("restore");
    sink
}

/// File names in `dir` (not recursive), sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("list")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// The sink's files in `.pending`, without the directory's owner lock
/// (`<prefix>.lock`, see `snapflow::storage::owner`).
fn pending_names(dir: &Path) -> Vec<String> {
    let mut names = names(&dir.join(".pending"));
    names.retain(|name| !name.ends_with(".lock"));
    names
}

fn read(path: PathBuf) -> String {
    fs::read_to_string(path).expect("read")
}

fn ids(state: &SinkState) -> Vec<u64> {
    PendingTransactions::decode(state)
        .expect("decode")
        .checkpoint_ids
}

#[test]
fn file_sink_files_move_through_pending_to_committed() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 1, None);
    sink.write_batch(&[1, 2]).unwrap();
    assert!(
        pending_names(dir.path()).is_empty(),
        "small writes stay in the buffer"
    );
    sink.finish().unwrap();
    assert_eq!(pending_names(dir.path()), ["part-1.inprogress"]);
    let state = sink.pre_commit(5).unwrap();
    assert_eq!(ids(&state), [5]);
    assert_eq!(pending_names(dir.path()), ["part-1-5.part"]);
    assert_eq!(names(dir.path()), [".pending"]);
    sink.commit(5).unwrap();
    assert_eq!(names(dir.path()), [".pending", "part-1-5"]);
    assert!(pending_names(dir.path()).is_empty());
    assert_eq!(read(dir.path().join("part-1-5")), "1\n2\n");
}

#[test]
fn file_sink_commit_is_idempotent_and_covers_earlier_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1]).unwrap();
    sink.pre_commit(1).unwrap();
    sink.write_batch(&[2]).unwrap();
    let state = sink.pre_commit(2).unwrap();
    assert_eq!(
        ids(&state),
        [1, 2],
        "a lost commit notification leaves 1 pending"
    );
    sink.commit(2).unwrap();
    sink.commit(2).unwrap();
    sink.commit(1).unwrap();
    let files = committed_files(dir.path(), "part").unwrap();
    assert_eq!(files.into_iter().map(read).collect::<String>(), "1\n2\n");
    // A new incarnation restoring the same state commits nothing twice.
    new_sink(dir.path(), 0, Some(&state));
    assert_eq!(names(dir.path()), [".pending", "part-0-1", "part-0-2"]);
}

#[test]
fn file_sink_empty_transaction_writes_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    let state = sink.pre_commit(1).unwrap();
    assert!(ids(&state).is_empty());
    sink.commit(1).unwrap();
    assert_eq!(names(dir.path()), [".pending"]);
    assert!(pending_names(dir.path()).is_empty());
}

#[test]
fn file_sink_restore_commits_listed_and_rolls_back_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1]).unwrap();
    let restored_state = sink.pre_commit(1).unwrap();
    sink.write_batch(&[2]).unwrap();
    sink.pre_commit(2).unwrap();
    sink.write_batch(&[3]).unwrap();
    sink.finish().unwrap();
    // Other subtasks' and other prefixes' files, and foreign files, must
    // survive subtask 0's rollback.
    let mut other = new_sink(dir.path(), 1, None);
    other.write_batch(&[9]).unwrap();
    other.pre_commit(2).unwrap();
    let other_prefix = factory(dir.path()).prefix("other").unwrap();
    let mut foreign = other_prefix.create(0, 4).unwrap();
    foreign.restore(None).unwrap();
    foreign.write_batch(&[8]).unwrap();
    foreign.pre_commit(2).unwrap();
    fs::write(dir.path().join(".pending/part-0-07.part"), "not ours").unwrap();
    drop(sink);

    new_sink(dir.path(), 0, Some(&restored_state));
    assert_eq!(read(dir.path().join("part-0-1")), "1\n");
    assert_eq!(
        pending_names(dir.path()),
        ["other-0-2.part", "part-0-07.part", "part-1-2.part"]
    );
    assert_eq!(names(dir.path()), [".pending", "part-0-1"]);
}

#[test]
fn file_sink_restore_without_state_rolls_back_everything_of_its_subtask() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 2, None);
    sink.write_batch(&[1]).unwrap();
    sink.pre_commit(1).unwrap();
    sink.write_batch(&[2]).unwrap();
    sink.finish().unwrap();
    drop(sink);
    assert_eq!(
        pending_names(dir.path()),
        ["part-2-1.part", "part-2.inprogress"]
    );
    new_sink(dir.path(), 2, None);
    assert!(pending_names(dir.path()).is_empty());
    assert_eq!(names(dir.path()), [".pending"]);
}

#[test]
fn file_sink_abort_discards_only_the_open_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1]).unwrap();
    sink.pre_commit(1).unwrap();
    sink.write_batch(&[2; 20_000]).unwrap();
    sink.abort().unwrap();
    assert_eq!(pending_names(dir.path()), ["part-0-1.part"]);
    sink.write_batch(&[3]).unwrap();
    sink.pre_commit(2).unwrap();
    sink.commit(2).unwrap();
    let files = committed_files(dir.path(), "part").unwrap();
    assert_eq!(files.into_iter().map(read).collect::<String>(), "1\n3\n");
}

#[test]
fn file_sink_writes_large_batches_across_buffer_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    let records: Vec<u32> = (0..50_000).collect();
    sink.write_batch(&records).unwrap();
    sink.pre_commit(1).unwrap();
    sink.commit(1).unwrap();
    let expected: String = records.iter().map(|record| format!("{record}\n")).collect();
    assert_eq!(read(dir.path().join("part-0-1")), expected);
}

#[test]
fn file_sink_custom_encoder() {
    let dir = tempfile::tempdir().unwrap();
    let encode =
        |record: &(u8, u8), out: &mut Vec<u8>| out.extend_from_slice(&[record.0, record.1]);
    let mut sink = FileSinkFactory::new(dir.path(), encode)
        .unwrap()
        .create(0, 1)
        .unwrap();
    sink.restore(None).unwrap();
    sink.write_batch(&[(1, 2), (3, 4)]).unwrap();
    sink.pre_commit(1).unwrap();
    sink.commit(1).unwrap();
    assert_eq!(fs::read(dir.path().join("part-0-1")).unwrap(), [1, 2, 3, 4]);
}

fn check_invalid_prefix(prefix: &str) {
    let dir = tempfile::tempdir().unwrap();
    let error = factory(dir.path()).prefix(prefix).unwrap_err();
    assert!(
        matches!(error, SinkError::InvalidName { .. }),
        "{prefix:?}: {error}"
    );
    assert!(!error.is_retryable());
    assert!(committed_files(dir.path(), prefix).is_err());
}

#[test]
fn invalid_prefixes_are_rejected() {
    check_invalid_prefix("");
    check_invalid_prefix("a-b");
    check_invalid_prefix("../x");
    check_invalid_prefix(".hidden");
    check_invalid_prefix("a b");
    check_invalid_prefix("ü");
    check_invalid_prefix(&"x".repeat(65));
}

#[test]
fn valid_prefix_of_64_bytes_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    assert!(factory(dir.path()).prefix(&"A_9".repeat(21)).is_ok());
}

#[test]
fn committed_files_sort_numerically_and_ignore_strangers() {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "part-0-10",
        "part-0-9",
        "part-1-2",
        "part-0-007",
        "part-x-1",
        "other-0-1",
        "part-0-1.tmp",
    ] {
        fs::write(dir.path().join(name), name).unwrap();
    }
    let files = committed_files(dir.path(), "part").unwrap();
    let found: Vec<String> = files.into_iter().map(read).collect();
    assert_eq!(found, ["part-0-9", "part-0-10", "part-1-2"]);
}

#[test]
fn file_sink_refuses_to_overwrite_existing_output() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("part-0-1"), "an earlier job").unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1]).unwrap();
    sink.pre_commit(1).unwrap();
    let error = sink.commit(1).unwrap_err();
    assert!(matches!(error, SinkError::TargetExists { .. }), "{error}");
    assert_eq!(read(dir.path().join("part-0-1")), "an earlier job");
}

#[test]
fn file_sink_reports_a_lost_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1]).unwrap();
    let state = sink.pre_commit(1).unwrap();
    fs::remove_file(dir.path().join(".pending/part-0-1.part")).unwrap();
    let mut restored = factory(dir.path()).create(0, 1).unwrap();
    let error = restored.restore(Some(&state)).unwrap_err();
    assert!(
        matches!(
            error,
            SinkError::MissingTransaction {
                subtask: 0,
                checkpoint_id: 1
            }
        ),
        "{error}"
    );
    assert!(!error.is_retryable());
}

#[test]
fn file_sink_rejects_another_subtasks_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    let state = sink.pre_commit(1).unwrap();
    let error = factory(dir.path())
        .create(1, 2)
        .unwrap()
        .restore(Some(&state))
        .unwrap_err();
    assert!(
        matches!(
            error,
            SinkError::WrongSubtask {
                expected: 1,
                found: 0
            }
        ),
        "{error}"
    );
}

#[test]
fn sinks_reject_misuse() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.pre_commit(3).unwrap();
    assert!(matches!(sink.pre_commit(3), Err(SinkError::Misuse { .. })));
    sink.finish().unwrap();
    assert!(matches!(
        sink.write_batch(&[1]),
        Err(SinkError::Misuse { .. })
    ));
    let mut collect = CollectHandle::new().sink(0);
    collect.pre_commit(2).unwrap();
    assert!(matches!(
        collect.pre_commit(1),
        Err(SinkError::Misuse { .. })
    ));
    collect.finish().unwrap();
    let error = collect.write_batch(&[1]).unwrap_err();
    assert!(matches!(error, SinkError::Misuse { .. }), "{error}");
    assert!(!error.is_retryable());
}

#[test]
fn collect_sink_shows_only_committed_output() {
    let handle = CollectHandle::new();
    let mut first = handle.create(0, 2).unwrap();
    let mut second = handle.create(1, 2).unwrap();
    first.restore(None).unwrap();
    second.restore(None).unwrap();
    second.write_batch(&[20]).unwrap();
    first.write_batch(&[10, 11]).unwrap();
    assert_eq!(
        handle.pending_len(),
        0,
        "the open transaction is not pending"
    );
    first.pre_commit(1).unwrap();
    second.pre_commit(1).unwrap();
    assert_eq!(handle.pending_len(), 3);
    assert!(handle.committed().is_empty());
    second.commit(1).unwrap();
    first.commit(1).unwrap();
    assert_eq!(handle.committed(), [10, 11, 20], "ordered by subtask");
    assert_eq!(handle.committed_of(1), [20]);
    assert_eq!(handle.pending_len(), 0);
}

#[test]
fn collect_sink_restore_commits_listed_and_drops_the_rest() {
    let handle = CollectHandle::new();
    let mut sink = handle.sink(0);
    sink.restore(None).unwrap();
    sink.write_batch(&["a"]).unwrap();
    let state = sink.pre_commit(1).unwrap();
    sink.write_batch(&["b"]).unwrap();
    sink.pre_commit(2).unwrap();
    sink.write_batch(&["c"]).unwrap();
    drop(sink);
    let mut restored = handle.sink(0);
    restored.restore(Some(&state)).unwrap();
    assert_eq!(handle.committed(), ["a"]);
    assert_eq!(handle.pending_len(), 0);
    // Restoring the same state again finds it committed: nothing changes.
    handle.sink(0).restore(Some(&state)).unwrap();
    assert_eq!(handle.committed(), ["a"]);
    let unknown = PendingTransactions {
        subtask: 0,
        checkpoint_ids: vec![9],
    }
    .encode();
    let error = handle.sink(0).restore(Some(&unknown)).unwrap_err();
    assert!(
        matches!(
            error,
            SinkError::MissingTransaction {
                checkpoint_id: 9,
                ..
            }
        ),
        "{error}"
    );
}

#[test]
fn print_sink_flushes_at_pre_commit_and_is_at_least_once() {
    let mut sink = PrintSink::new(Vec::new());
    sink.restore(None).unwrap();
    sink.write_batch(&["x", "y"]).unwrap();
    assert_eq!(sink.pre_commit(1).unwrap(), SinkState::default());
    sink.commit(1).unwrap();
    assert_eq!(sink.guarantee(), Guarantee::AtLeastOnce);
    assert_eq!(sink.into_inner().unwrap(), b"x\ny\n");
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        new_sink(dir.path(), 0, None).guarantee(),
        Guarantee::ExactlyOnce
    );
    assert_eq!(
        Guarantee::ExactlyOnce.weakest(Guarantee::AtLeastOnce),
        Guarantee::AtLeastOnce
    );
}

fn check_malformed(bytes: &[u8]) {
    let error = PendingTransactions::decode(&SinkState::from_bytes(bytes.to_vec())).unwrap_err();
    assert!(
        matches!(error, SinkError::MalformedState { .. }),
        "{bytes:?}: {error}"
    );
    assert!(!error.is_retryable());
}

#[test]
fn malformed_states_are_rejected() {
    check_malformed(&[]);
    check_malformed(&[1, 0, 0, 0]);
    // Format 3 is unknown; format 2 (the file sink's, with digests) must
    // have 20 bytes per transaction.
    check_malformed(&[3, 0, 0, 0, 0, 0, 0, 0, 0]);
    check_malformed(&[2, 0, 0, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0]);
    check_malformed(&[1, 0, 0, 0, 0, 1, 0, 0, 0]);
    check_malformed(&[1, 0, 0, 0, 0, 255, 255, 255, 255, 1, 2, 3, 4, 5, 6, 7, 8]);
    let descending = PendingTransactions {
        subtask: 0,
        checkpoint_ids: vec![2, 1],
    }
    .encode();
    check_malformed(descending.as_bytes());
}

proptest! {
    #[test]
    fn pending_transactions_round_trip(subtask in any::<u32>(), mut ids in proptest::collection::btree_set(any::<u64>(), 0..20)) {
        let pending = PendingTransactions { subtask, checkpoint_ids: std::mem::take(&mut ids).into_iter().collect() };
        prop_assert_eq!(PendingTransactions::decode(&pending.encode()).unwrap(), pending);
    }

    #[test]
    fn hostile_state_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let state = SinkState::from_bytes(bytes);
        if let Ok(pending) = PendingTransactions::decode(&state) {
            prop_assert_eq!(pending.encode(), state);
        }
    }
}

/// A runtime shares factories between arbiter threads and moves sinks into
/// them; these bounds must hold for the built-ins.
#[test]
fn built_in_sinks_can_cross_threads() {
    fn shared<T: Send + Sync + 'static>(_: &T) {}
    fn movable<T: Send + 'static>(_: &T) {}
    let dir = tempfile::tempdir().unwrap();
    let files = factory(dir.path());
    shared(&files);
    movable(&files.create(0, 1).unwrap());
    let handle = CollectHandle::<String>::new();
    shared(&handle);
    movable(&handle.sink(0));
    movable(&PrintSink::<u8, _>::stdout());
}

/// A runtime may hold sinks as trait objects: one virtual call per batch.
#[test]
fn sinks_work_as_trait_objects() {
    let dir = tempfile::tempdir().unwrap();
    let handle = CollectHandle::new();
    let sinks: Vec<Box<dyn Sink<Item = u32>>> = vec![
        Box::new(handle.sink(0)),
        Box::new(factory(dir.path()).create(0, 1).unwrap()),
    ];
    for mut sink in sinks {
        sink.restore(None).unwrap();
        sink.write_batch(&[4, 5]).unwrap();
        sink.pre_commit(1).unwrap();
        sink.commit(1).unwrap();
    }
    assert_eq!(handle.committed(), [4, 5]);
    assert_eq!(read(dir.path().join("part-0-1")), "4\n5\n");
}

// ------------------------------------------------- checks before a restore

/// How a staged file is damaged after its pre-commit.
#[derive(Debug, Clone, Copy)]
enum Damage {
    None,
    Flip,
    Truncate,
    Grow,
    Delete,
}

/// Pre-commits checkpoints 1 and 2 (1 committed), damages the staged file
/// of 2, and returns what a fresh sink says before restoring 2, and what
/// restoring 2 then does.
fn check_staged(damage: Damage) -> (Result<Visibility, SinkError>, Result<(), SinkError>) {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 0, None);
    sink.write_batch(&[1, 2, 3]).unwrap();
    sink.pre_commit(1).unwrap();
    sink.commit(1).unwrap();
    sink.write_batch(&[40, 50, 60]).unwrap();
    let state = sink.pre_commit(2).unwrap();
    drop(sink);
    let staged = dir.path().join(".pending/part-0-2.part");
    let mut bytes = fs::read(&staged).unwrap();
    match damage {
        Damage::None => {}
        Damage::Flip => bytes[4] ^= 0x20,
        Damage::Truncate => bytes.truncate(bytes.len() - 1),
        Damage::Grow => bytes.push(b'7'),
        Damage::Delete => {}
    }
    match damage {
        Damage::Delete => fs::remove_file(&staged).unwrap(),
        _ => fs::write(&staged, &bytes).unwrap(),
    }
    let mut fresh = factory(dir.path()).create(0, 1).unwrap();
    let checked = fresh.check_restore(Some(2), Some(&state));
    let mut restoring = factory(dir.path()).create(0, 1).unwrap();
    (checked, restoring.restore(Some(&state)))
}

fn check_damaged(damage: Damage, reason: &str) {
    let (checked, restored) = check_staged(damage);
    if let Damage::Delete = damage {
        // `restore` has nothing to verify, and it says the data is lost.
        assert!(
            matches!(
                restored,
                Err(SinkError::MissingTransaction {
                    checkpoint_id: 2,
                    ..
                })
            ),
            "{restored:?}"
        );
    }
    let results = match damage {
        Damage::Delete => vec![checked.map(|_| ())],
        _ => vec![checked.map(|_| ()), restored],
    };
    for result in results {
        match result {
            Err(SinkError::StagedDataDamaged {
                checkpoint_id: 2,
                reason: text,
                ..
            }) => assert!(text.contains(reason), "{damage:?}: {text}"),
            other => panic!("{damage:?}: expected StagedDataDamaged, got {other:?}"),
        }
    }
}

#[test]
fn damaged_staged_files_are_refused_before_they_are_committed() {
    check_damaged(Damage::Flip, "CRC-32");
    check_damaged(Damage::Truncate, "found 8 bytes");
    check_damaged(Damage::Grow, "found 10 bytes");
    check_damaged(Damage::Delete, "missing");
}

#[test]
fn intact_staged_files_pass_the_check_and_commit() {
    let (checked, restored) = check_staged(Damage::None);
    assert_eq!(checked.unwrap(), Visibility::Known(Vec::new()));
    restored.unwrap();
}

#[test]
fn the_file_sink_lists_what_it_committed_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = new_sink(dir.path(), 1, None);
    let mut state_of_2 = None;
    for checkpoint in 1..=4 {
        sink.write_batch(&[checkpoint as u32]).unwrap();
        let state = sink.pre_commit(checkpoint).unwrap();
        sink.commit(checkpoint).unwrap();
        if checkpoint == 2 {
            state_of_2 = Some(state);
        }
    }
    // Another subtask's output is not this one's.
    let mut other = new_sink(dir.path(), 0, None);
    other.write_batch(&[9]).unwrap();
    other.pre_commit(7).unwrap();
    other.commit(7).unwrap();
    let mut fresh = factory(dir.path()).create(1, 2).unwrap();
    let after_2 = fresh.check_restore(Some(2), state_of_2.as_ref()).unwrap();
    assert_eq!(after_2, Visibility::Known(vec![3, 4]));
    assert_eq!(after_2.committed(), [3, 4]);
    let from_nothing = fresh.check_restore(None, None).unwrap();
    assert_eq!(from_nothing, Visibility::Known(vec![1, 2, 3, 4]));
}

#[test]
fn the_collect_sink_lists_what_it_committed_and_notices_lost_transactions() {
    let handle = CollectHandle::<u32>::new();
    let mut sink = handle.create(0, 1).unwrap();
    sink.restore(None).unwrap();
    sink.write_batch(&[1]).unwrap();
    let first = sink.pre_commit(1).unwrap();
    sink.commit(1).unwrap();
    sink.write_batch(&[2]).unwrap();
    sink.pre_commit(2).unwrap();
    sink.commit(2).unwrap();
    let mut fresh = handle.create(0, 1).unwrap();
    assert_eq!(
        fresh.check_restore(Some(1), Some(&first)).unwrap(),
        Visibility::Known(vec![2])
    );
    // A fresh handle (another process) never saw transaction 1.
    let mut elsewhere = CollectHandle::<u32>::new().create(0, 1).unwrap();
    assert!(matches!(
        elsewhere.check_restore(Some(1), Some(&first)),
        Err(SinkError::MissingTransaction {
            checkpoint_id: 1,
            ..
        })
    ));
}
