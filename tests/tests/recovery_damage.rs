//! Recovery when the disk lies: a run crashes just before or just after a
//! sink commit, one file of the newest checkpoint, an older checkpoint or
//! the sink's staging area is flipped, cut or deleted, and the job resumes
//! on the same directories. Every case must end exactly-once, or with the
//! typed `FallbackWouldDuplicate` (and then, with the user's consent,
//! at-least-once with the duplicates reported); none may panic, hang, or
//! report exactly-once with duplicates.
//!
//! The same cases run with the checkpoints on S3 (moto from `.ci/s3.sh`,
//! a fresh prefix per case; the damage rewrites or deletes the objects
//! through the test's own HTTP client, and the sink's output stays on
//! disk). They need `SNAPFLOW_S3_ENDPOINT`: skipped outside CI without
//! it, a failure in CI. Every harm exists on object storage: a crash
//! cannot tear a PUT, but an object can still be rewritten flipped or
//! cut, or deleted, behind the store's back.
//!
//! Seeds: `SNAPFLOW_DAMAGE_SEEDS` (default 30 per crash kind on disk and
//! 10 per crash kind on S3, so 80 in CI); `SNAPFLOW_SEED=n` replays seed
//! n of every kind.

use std::collections::HashMap;
use std::time::Duration;

use snapflow::job::{GuaranteeReason, JobError, JobReport};
use snapflow::sink::Guarantee;
use snapflow_tests::damage::{self, Crash, Damage, Dirs, Harm, S3Prefix, StoreKind, Target};
use snapflow_tests::file_sink::committed;
use snapflow_tests::pipeline::expected;
use snapflow_tests::{seeds, TestRng};

const LIMIT: Duration = Duration::from_secs(60);
/// The default seed count per crash kind on S3 (every request to moto is
/// a Python HTTP round trip, so a case costs more than on disk).
const S3_SEEDS: u64 = 10;

/// Counts of each record.
fn multiset(records: &[(u64, u64)]) -> HashMap<(u64, u64), usize> {
    let mut counts = HashMap::new();
    for record in records {
        *counts.entry(*record).or_insert(0) += 1;
    }
    counts
}

/// The committed output is exactly the failure-free output.
fn assert_exactly_once(dirs: &Dirs, replay: &str) {
    let (want, _) = expected(damage::RECORDS);
    let got = committed(&dirs.output).expect("the committed output reads");
    assert_eq!(got.len(), want.len(), "{replay}: record count differs");
    assert!(got == want, "{replay}: committed output differs");
}

/// Every expected record is there at least once, and nothing else.
fn assert_at_least_once(dirs: &Dirs, replay: &str) {
    let (want, _) = expected(damage::RECORDS);
    let got = multiset(&committed(&dirs.output).expect("the committed output reads"));
    let want = multiset(&want);
    for (record, count) in &want {
        let found = got.get(record).copied().unwrap_or(0);
        assert!(found >= *count, "{replay}: {record:?} lost");
    }
    assert!(
        got.keys().all(|record| want.contains_key(record)),
        "{replay}: a record that should not exist"
    );
}

/// Whether the damage makes the newest checkpoint unloadable (a deleted
/// `_metadata` only makes it look never committed, which is not reported
/// as a fallback; damage elsewhere leaves it loadable).
fn breaks_newest(damage: &Damage) -> bool {
    match damage.target {
        Target::NewestMetadata => damage.harm != Harm::Delete,
        Target::NewestPart => true,
        Target::OlderPart | Target::Staged => false,
    }
}

/// A resumed run that succeeded: its guarantee matches its output, and
/// no id went back.
fn judge_ok(report: &JobReport, dirs: &Dirs, damage: &Damage, replay: &str) {
    // A second run after a refusal finds the damaged checkpoint already
    // set aside, so only the first reports the fallback.
    let first_run = !report.guarantee_reasons.iter().any(|reason| {
        matches!(
            reason,
            GuaranteeReason::FallbackReplaysCommittedOutput { .. }
        )
    });
    if first_run && breaks_newest(damage) {
        assert!(
            report
                .fallbacks
                .iter()
                .any(|fallback| fallback.checkpoint == damage.newest),
            "{replay}: no fallback past {} reported: {report:?}",
            damage.newest,
        );
    }
    if breaks_newest(damage) {
        for checkpoint in &report.checkpoints {
            assert!(
                checkpoint.checkpoint > damage.newest,
                "{replay}: checkpoint id {} went back",
                checkpoint.checkpoint
            );
        }
    }
    match report.guarantee {
        Guarantee::ExactlyOnce => assert_exactly_once(dirs, replay),
        Guarantee::AtLeastOnce => {
            assert!(
                report.guarantee_reasons.iter().any(|reason| matches!(
                    reason,
                    GuaranteeReason::FallbackReplaysCommittedOutput { .. }
                )),
                "{replay}: at-least-once for another reason: {:?}",
                report.guarantee_reasons
            );
            assert_at_least_once(dirs, replay);
        }
    }
}

fn check(store: &StoreKind, seed: u64, crash_kind: fn(u64) -> Crash) {
    let mut rng = TestRng::new(seed);
    let crash = crash_kind(rng.between(2, 9));
    let root = tempfile::tempdir().expect("a temporary directory");
    let dirs = Dirs::new(store, root.path());
    // The crash run fails by design (or ends, if the crash came too late).
    let _ = damage::crash_run(&dirs, crash);
    let Some(damage) = damage::damage(&dirs, &mut rng) else {
        eprintln!("seed {seed}: {crash:?} left no checkpoint; nothing to damage");
        return;
    };
    let replay = format!(
        "seed {seed} ({crash:?}, {:?} {:?} of {}; replay with SNAPFLOW_SEED={seed})",
        damage.harm, damage.target, damage.place
    );
    match damage::resume(&dirs, false, LIMIT) {
        Ok(report) => {
            eprintln!(
                "{replay}: ran, {:?}, {} fallbacks",
                report.guarantee,
                report.fallbacks.len()
            );
            judge_ok(&report, &dirs, &damage, &replay);
        }
        Err(JobError::FallbackWouldDuplicate {
            restored,
            committed,
            ..
        }) => {
            assert!(!committed.is_empty(), "{replay}: refused without a reason");
            assert!(
                committed
                    .iter()
                    .all(|id| restored.is_none_or(|restored| *id > restored)),
                "{replay}: refused for output before the restored checkpoint"
            );
            eprintln!("{replay}: refused, committed {committed:?} after {restored:?}");
            let report = damage::resume(&dirs, true, LIMIT)
                .unwrap_or_else(|error| panic!("{replay}: with duplicates accepted: {error}"));
            assert_eq!(report.guarantee, Guarantee::AtLeastOnce, "{replay}");
            judge_ok(&report, &dirs, &damage, &replay);
        }
        Err(error) => panic!("{replay}: {error}"),
    }
}

/// The S3 cases' bucket, or `None` (skipping) outside CI without a
/// server.
fn s3() -> Option<StoreKind> {
    S3Prefix::fresh_bucket("S3 damage").map(StoreKind::S3)
}

#[test]
fn damage_after_a_crash_before_a_commit_ends_exactly_once_or_typed() {
    for seed in seeds("SNAPFLOW_DAMAGE_SEEDS", 30) {
        check(&StoreKind::Dir, seed, Crash::BeforeCommit);
    }
}

#[test]
fn damage_after_a_crash_after_a_commit_ends_exactly_once_or_typed() {
    for seed in seeds("SNAPFLOW_DAMAGE_SEEDS", 30) {
        check(&StoreKind::Dir, seed, Crash::AfterCommit);
    }
}

#[test]
fn on_s3_damage_after_a_crash_before_a_commit_ends_exactly_once_or_typed() {
    let Some(s3) = s3() else { return };
    for seed in seeds("SNAPFLOW_DAMAGE_SEEDS", S3_SEEDS) {
        check(&s3, seed, Crash::BeforeCommit);
    }
}

#[test]
fn on_s3_damage_after_a_crash_after_a_commit_ends_exactly_once_or_typed() {
    let Some(s3) = s3() else { return };
    for seed in seeds("SNAPFLOW_DAMAGE_SEEDS", S3_SEEDS) {
        check(&s3, seed, Crash::AfterCommit);
    }
}
