//! Falling back past a damaged newest checkpoint, case by case:
//!
//! - its output was only staged (the crash came before the commit): the
//!   job falls back, replays, and ends exactly-once, with the fallback
//!   reported, the damaged directory set aside and every new checkpoint
//!   numbered above it;
//! - its output was already visible: the job refuses to start with
//!   `FallbackWouldDuplicate`, and with `accept_duplicates_after_fallback`
//!   it runs and reports at-least-once (the first two defects of issue 11:
//!   silent duplicates, and the `TargetExists` dead end);
//! - its staged sink file is damaged: the checkpoint counts as damaged,
//!   and the job falls back past it exactly-once (the third defect).
//!
//! Each test tries seeds until the crash run leaves the state it needs
//! (two sink subtasks commit independently, so a crash can fall between
//! them), at most `TRIES`.

use std::path::Path;
use std::time::Duration;

use snapflow::job::{GuaranteeReason, JobError};
use snapflow::sink::Guarantee;
use snapflow_tests::damage::{self, Crash, Dirs, Harm, Target};
use snapflow_tests::file_sink::committed;
use snapflow_tests::pipeline::expected;
use snapflow_tests::TestRng;

const LIMIT: Duration = Duration::from_secs(60);
const TRIES: u64 = 40;

/// A crash run in a fresh directory whose newest checkpoint `n` (above 1)
/// has committed output (`visible`), or has only staged output and no
/// committed output at or above `n`. Returns the directory and `n`.
fn prepared(crash: fn(u64) -> Crash, visible: bool) -> (tempfile::TempDir, Dirs, u64) {
    for seed in 1..=TRIES {
        let mut rng = TestRng::new(seed);
        let root = tempfile::tempdir().expect("a temporary directory");
        let dirs = Dirs::under(root.path());
        let _ = damage::crash_run(&dirs, crash(rng.between(3, 9)));
        let Some(&newest) = damage::checkpoint_ids(&dirs).last() else {
            continue;
        };
        let committed = damage::committed_checkpoints(&dirs);
        let newest_visible = committed.contains(&newest);
        let staged = damage::newest_file(&dirs, newest, Target::Staged, "").exists();
        let fits = if visible {
            newest_visible
        } else {
            !newest_visible && staged && committed.iter().all(|id| *id < newest)
        };
        if fits && newest > 1 {
            return (root, dirs, newest);
        }
    }
    panic!("no crash run in {TRIES} seeds left the state this test needs");
}

fn harm(path: &Path, harm: Harm) {
    damage::apply(path, harm, &mut TestRng::new(7));
}

fn assert_exactly_once(dirs: &Dirs) {
    let (want, _) = expected(damage::RECORDS);
    assert!(
        committed(&dirs.output).expect("the output reads") == want,
        "the committed output differs"
    );
}

/// Staged-only output of the damaged checkpoint: exactly-once.
fn check_staged_only(target: Target, harm_done: Harm) {
    let (_root, dirs, newest) = prepared(Crash::BeforeCommit, false);
    harm(
        &damage::newest_file(&dirs, newest, target, "count"),
        harm_done,
    );
    let report = damage::resume(&dirs, false, LIMIT).expect("the fallback runs");
    assert_eq!(report.guarantee, Guarantee::ExactlyOnce, "{report:?}");
    assert_exactly_once(&dirs);
    let fallback = report
        .fallbacks
        .iter()
        .find(|fallback| fallback.checkpoint == newest)
        .unwrap_or_else(|| panic!("no fallback past {newest}: {:?}", report.fallbacks));
    assert!(fallback.restored < Some(newest));
    let moved = fallback
        .set_aside
        .as_ref()
        .expect("the damaged checkpoint moved");
    assert!(moved.exists(), "{moved:?}");
    let name = moved.file_name().unwrap_or_default().to_string_lossy();
    assert!(name.contains(".damaged-"), "{name}");
    let note = std::fs::read_to_string(moved.join("_damaged")).expect("the note");
    assert_eq!(note, fallback.reason);
    assert!(
        report
            .checkpoints
            .iter()
            .all(|checkpoint| checkpoint.checkpoint > newest),
        "an id went back: {:?}",
        report.checkpoints
    );
    assert!(!report.checkpoints.is_empty());
}

#[test]
fn a_fallback_with_nothing_committed_past_it_is_exactly_once() {
    check_staged_only(Target::NewestPart, Harm::Flip);
    check_staged_only(Target::NewestMetadata, Harm::Truncate);
}

#[test]
fn a_damaged_staged_sink_file_makes_its_checkpoint_fall_back() {
    check_staged_only(Target::Staged, Harm::Flip);
    check_staged_only(Target::Staged, Harm::Truncate);
    check_staged_only(Target::Staged, Harm::Delete);
}

/// Visible output of the damaged checkpoint: refused, then at-least-once
/// by choice.
fn check_visible(target: Target, harm_done: Harm) {
    let (_root, dirs, newest) = prepared(Crash::AfterCommit, true);
    harm(
        &damage::newest_file(&dirs, newest, target, "count"),
        harm_done,
    );
    let error = damage::resume(&dirs, false, LIMIT).expect_err("a duplicating fallback ran");
    let JobError::FallbackWouldDuplicate {
        restored,
        ref sink,
        ref committed,
        ref skipped,
        ..
    } = error
    else {
        panic!("expected FallbackWouldDuplicate, got {error}");
    };
    assert!(restored < Some(newest));
    assert_eq!(sink, "collect");
    assert!(committed.contains(&newest), "{error}");
    assert!(skipped.contains(&newest), "{error}");
    assert!(!error.is_retryable());
    let text = error.to_string();
    assert!(text.contains("accept_duplicates_after_fallback"), "{text}");
    assert!(text.contains(&format!("checkpoint {newest}")), "{text}");
    // Refusing again is the same answer: the damaged checkpoint was set
    // aside, but the sink's output still says what was committed.
    let again = damage::resume(&dirs, false, LIMIT).expect_err("refused again");
    assert!(
        matches!(again, JobError::FallbackWouldDuplicate { .. }),
        "{again}"
    );
    let report = damage::resume(&dirs, true, LIMIT).expect("with duplicates accepted");
    assert_eq!(report.guarantee, Guarantee::AtLeastOnce);
    assert!(report.guarantee_reasons.iter().any(|reason| matches!(
        reason,
        GuaranteeReason::FallbackReplaysCommittedOutput { committed, .. } if committed.contains(&newest)
    )));
    // No `TargetExists` dead end: the new checkpoints are numbered above
    // everything committed.
    assert!(report
        .checkpoints
        .iter()
        .all(|checkpoint| checkpoint.checkpoint > newest));
    let (want, _) = expected(damage::RECORDS);
    let got = committed_output(&dirs);
    assert!(
        got.len() > want.len(),
        "no duplicates in an at-least-once fallback?"
    );
    assert!(want.iter().all(|record| got.binary_search(record).is_ok()));
}

fn committed_output(dirs: &Dirs) -> Vec<(u64, u64)> {
    committed(&dirs.output).expect("the output reads")
}

#[test]
fn a_fallback_past_committed_output_is_refused_unless_accepted() {
    check_visible(Target::NewestPart, Harm::Flip);
    check_visible(Target::NewestMetadata, Harm::Flip);
}

#[test]
fn a_sink_whose_replays_are_harmless_runs_a_fallback_past_its_output() {
    let (_root, dirs, newest) = prepared(Crash::AfterCommit, true);
    harm(
        &damage::newest_file(&dirs, newest, Target::NewestPart, "count"),
        Harm::Flip,
    );
    let report = damage::resume_replay_safe(&dirs, LIMIT).expect("a harmless replay runs");
    assert_eq!(report.guarantee, Guarantee::ExactlyOnce, "{report:?}");
    assert!(report
        .fallbacks
        .iter()
        .any(|fallback| fallback.checkpoint == newest));
    let (want, _) = expected(damage::RECORDS);
    let got = committed_output(&dirs);
    assert!(want.iter().all(|record| got.binary_search(record).is_ok()));
}
