//! The Kafka source and exactly-once sink against a real broker (never a
//! mock), which `.ci/run` starts with `.ci/kafka.sh`; locally run
//! `eval "$(.ci/kafka.sh start)"` first. Without `SNAPFLOW_KAFKA_BROKERS`
//! each test prints how to start the broker and passes, except in CI
//! (`CI=true`), where it fails.
//!
//! - Kafka → parse → keyed count → Kafka at parallelism 1, 2 and 3, with
//!   seeded panics in operators and input topics of 1 to 5 partitions
//!   (more and fewer than subtasks): the output topic, restricted to the
//!   transactions the sink committed (the broker, tansu 0.6, shows aborted
//!   records to every reader: see `kafka_probe.rs`), holds every result
//!   exactly once, and the count state equals a direct computation over
//!   the input.
//! - A job stopped with a savepoint and resumed at another parallelism:
//!   partitions are spread again and the output is still exactly once.
//! - The sink's contract call by call: a restore commits what a dropped
//!   sink pre-committed, a second commit changes nothing, foreign state
//!   bytes are typed errors.
//! - A source starts at the earliest offsets, the latest, or a timestamp.
//! - Bad input: undecodable records dropped and counted, or failing the
//!   job without retries; an empty topic; a missing topic, an unreachable
//!   broker and a transaction time-out shorter than the checkpoint
//!   interval are typed errors before any record flows.
//!
//! Seeds: `SNAPFLOW_KAFKA_SEEDS` (default 4 per parallelism) from 1 on;
//! `SNAPFLOW_SEED=n` replays seed n. A failing run names its seed.

#[path = "kafka/support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::connectors::kafka::{
    BadRecords, CommitLog, Delivery, DroppedRecords, KafkaError, KafkaOut, KafkaRecord,
    KafkaSinkConfig, KafkaSinkFactory, KafkaSourceConfig, KafkaSourceFactory, StartFrom,
};
use snapflow::job::{Job, JobConfig, JobError, JobReport, KeyedStateHandle, RestartStrategy};
use snapflow::sink::{Sink, SinkError, SinkFactory, SinkState, Visibility};
use snapflow::storage::{CheckpointStore, MemoryCheckpointStore};
use snapflow::Snapshot;
use snapflow_tests::kafka_count::{decode_id as decode_input, encode_count as encode_output};
use snapflow_tests::{quiet_injected_panics, seeds, FaultKind, Faults, TestRng};

use support::{
    broker, committed_results, create_topic, locate_missing, produce, read_results, txn_header,
    unique,
};

/// Keys of the count.
const KEYS: u64 = 7;
/// The checkpoint interval of every job here.
const INTERVAL_MS: u64 = 100;

/// The per-key state of `count`.
#[derive(Snapshot, Debug, Clone, Default)]
struct Count {
    /// Records seen for the key.
    seen: u64,
}

/// The input value of record `id`: its decimal id.
fn encode_input(id: u64) -> Vec<u8> {
    id.to_string().into_bytes()
}

/// Writes ids `0..records` spread over `partitions` partitions of `topic`.
fn fill(brokers: &str, topic: &str, partitions: i32, records: u64) {
    let rows: Vec<_> = (0..records)
        .map(|id| {
            (
                (id % partitions as u64) as i32,
                Vec::new(),
                encode_input(id),
            )
        })
        .collect();
    produce(brokers, topic, &rows);
}

/// The output encoder's type.
type Encode = fn(&(u64, u64)) -> KafkaOut;
/// The sink factory of every job here.
type OutSink = KafkaSinkFactory<(u64, u64), Encode>;

fn sink_factory(brokers: &str, topic: &str, job: &str) -> OutSink {
    let mut config = KafkaSinkConfig::new(brokers, topic, job, "out");
    config.transaction_timeout_ms = 30_000;
    KafkaSinkFactory::new(config, encode_output as Encode).expect("the sink's start checks pass")
}

type Decode = fn(&KafkaRecord<'_>) -> Result<u64, String>;

fn source_factory(brokers: &str, topic: &str, bad: BadRecords) -> KafkaSourceFactory<Decode> {
    let mut config = KafkaSourceConfig::new(brokers, &[topic]);
    config.bounded = true;
    config.bad_records = bad;
    KafkaSourceFactory::new(config, decode_input as Decode).expect("the source's start checks pass")
}

fn job_config(store: Option<Arc<dyn CheckpointStore>>, attempts_max: u32) -> JobConfig {
    JobConfig {
        checkpoint_interval_ms: Some(INTERVAL_MS),
        batch_size_max: 32,
        max_parallelism: 16,
        arbiters: Some(2),
        store,
        restart: RestartStrategy::FixedDelay {
            attempts_max,
            delay_ms: 0,
        },
        ..JobConfig::default()
    }
}

/// Declares source → parse → count → sink on `job`: every operator at
/// `parallelism` except the sink at `sink_parallelism`. `parse` panics as
/// `faults` plan and sleeps `pause_us` per record (to stretch a run over
/// several checkpoints); `seen` counts parsed records.
#[allow(clippy::too_many_arguments)]
fn declare(
    job: &Job,
    source: KafkaSourceFactory<Decode>,
    sink: OutSink,
    parallelism: usize,
    sink_parallelism: usize,
    faults: &Faults,
    pause_us: u64,
    seen: &Arc<AtomicU64>,
) -> KeyedStateHandle<u64, Count> {
    let (faults, count_faults, seen) = (faults.clone(), faults.clone(), Arc::clone(seen));
    let (counted, state) = job
        .source("in", source)
        .parallelism(parallelism)
        .map("parse", move |id: u64| {
            faults.check_or_panic("parse", id);
            if pause_us > 0 {
                thread::sleep(Duration::from_micros(pause_us));
            }
            seen.fetch_add(1, Ordering::Relaxed);
            id
        })
        .parallelism(parallelism)
        .key_by(|id: &u64| id % KEYS)
        .process_with_state("count", move |key: &u64, count: &mut Count, id, out| {
            count_faults.check("count", id)?;
            count.seen += 1;
            out.emit((*key, count.seen));
            Ok(())
        });
    counted
        .parallelism(parallelism)
        .sink("out", sink)
        .parallelism(sink_parallelism);
    state
}

/// Every `(key, count)` the output topic holds in transactions the sink
/// committed, sorted, and how many records it holds in all (aborted
/// transactions included, as the broker shows them). It reads until
/// `want` (sorted) is all there, or its time limit: a busy broker
/// answers fetches late, and a reader that stopped at the first quiet
/// gap saw results missing.
fn committed_output(
    brokers: &str,
    topic: &str,
    log: &CommitLog,
    want: &[(u64, u64)],
) -> (Vec<(u64, u64)>, usize) {
    let committed: BTreeSet<String> = log.committed().into_iter().collect();
    let all = read_results(brokers, topic, &committed, want, Duration::from_millis(700));
    assert!(
        all.iter().all(|read| txn_header(read).is_some()),
        "every exactly-once record carries its transaction"
    );
    let kept: Vec<(u64, u64)> = committed_results(&all, &committed)
        .into_iter()
        .map(|(result, _)| result)
        .collect();
    if kept != want {
        eprintln!("{}", locate_missing(&all, &committed, want));
    }
    (kept, all.len())
}

/// What `got` lacks and holds beyond `want` (both sorted), for a
/// failure's message: the state checks before it say whether the count
/// saw every record, so this tells lost output from a lost record.
fn difference(got: &[(u64, u64)], want: &[(u64, u64)]) -> String {
    let mut extra = got.to_vec();
    let mut missing = Vec::new();
    for result in want {
        match extra.iter().position(|g| g == result) {
            Some(index) => {
                extra.remove(index);
            }
            None => missing.push(*result),
        }
    }
    format!(
        "{} results, {} wanted; missing {missing:?}; extra {extra:?}",
        got.len(),
        want.len()
    )
}

/// The failure-free result over ids `0..records`: every `(key, n)` for
/// `n` up to the key's count, and each key's final count.
fn expected(ids: impl Iterator<Item = u64>) -> (Vec<(u64, u64)>, BTreeMap<u64, u64>) {
    let mut counts = BTreeMap::new();
    let mut out = Vec::new();
    for id in ids {
        let count = counts.entry(id % KEYS).or_insert(0);
        *count += 1;
        out.push((id % KEYS, *count));
    }
    out.sort_unstable();
    (out, counts)
}

fn final_state(state: &KeyedStateHandle<u64, Count>) -> BTreeMap<u64, u64> {
    state
        .snapshot()
        .into_iter()
        .map(|(key, count)| (key, count.seen))
        .collect()
}

/// Runs source → parse → count → sink over `input` as job `job_name`
/// (`(brokers, input, job_name)`), everything at `parallelism`, up to 10
/// restarts, `parse` failing as `faults` plan and sleeping `pause_us` per
/// record.
fn run_count(
    (brokers, input, job_name): (&str, &str, &str),
    sink: OutSink,
    parallelism: usize,
    faults: &Faults,
    pause_us: u64,
) -> Result<(JobReport, KeyedStateHandle<u64, Count>), JobError> {
    let job = Job::new(job_name, job_config(None, 10));
    let seen = Arc::new(AtomicU64::new(0));
    let source = source_factory(brokers, input, BadRecords::Fail);
    let state = declare(
        &job,
        source,
        sink,
        parallelism,
        parallelism,
        faults,
        pause_us,
        &seen,
    );
    Ok((job.run()?, state))
}

/// One seeded run: random record and partition counts, two panics; the
/// committed output and the state must equal the direct computation.
fn check(parallelism: usize, seed: u64) {
    let Some(brokers) = broker() else { return };
    quiet_injected_panics();
    let replay =
        format!("parallelism {parallelism}, seed {seed} (replay with SNAPFLOW_SEED={seed})");
    let mut rng = TestRng::new(seed);
    let records = rng.between(100, 300);
    let partitions = rng.between(1, 5) as i32;
    let (input, output, job_name) = (unique("in"), unique("out"), unique("job"));
    create_topic(&brokers, &input, partitions);
    create_topic(&brokers, &output, 3);
    let started = Instant::now();
    fill(&brokers, &input, partitions, records);
    let filled_ms = started.elapsed().as_millis();
    let faults = Faults::new(vec![
        ("parse", rng.between(0, records - 1), FaultKind::Panic),
        ("count", rng.between(0, records - 1), FaultKind::Error),
    ]);
    let sink = sink_factory(&brokers, &output, &job_name);
    let log = sink.commit_log();
    let (report, state) = run_count(
        (&brokers, &input, &job_name),
        sink,
        parallelism,
        &faults,
        20,
    )
    .unwrap_or_else(|error| panic!("{replay}: the job failed: {error}"));
    let ran_ms = started.elapsed().as_millis() - filled_ms;
    let (want, want_state) = expected(0..records);
    let (got, total) = committed_output(&brokers, &output, &log, &want);
    let read_ms = started.elapsed().as_millis() - filled_ms - ran_ms;
    assert_eq!(faults.fired(), 2, "{replay}: both faults fire");
    assert!(!report.restarts.is_empty(), "{replay}: the job restarted");
    assert_eq!(final_state(&state), want_state, "{replay}: state");
    assert!(
        got == want,
        "{replay}: committed output: {}",
        difference(&got, &want)
    );
    assert_eq!(
        (log.recovered(), log.rewritten()),
        (0, 0),
        "{replay}: in one process every pending transaction has its producer"
    );
    eprintln!(
        "{replay}: {records} records over {partitions} partitions, {} committed results, \
         {} records in the topic (aborted included), {} restarts; input written in {filled_ms} ms, \
         job {ran_ms} ms, output read in {read_ms} ms",
        got.len(),
        total,
        report.restarts.len()
    );
}

/// Runs [`check`] for every seed at once, one thread each: a run spends
/// most of its time waiting for the broker (a transaction's set-up and
/// flush take about 150 ms on tansu), so running them side by side keeps
/// the test's wall time near that of one run. A failing seed's panic
/// names it.
fn check_seeds(parallelism: usize) {
    thread::scope(|scope| {
        let runs: Vec<_> = seeds("SNAPFLOW_KAFKA_SEEDS", 4)
            .into_iter()
            .map(|seed| scope.spawn(move || check(parallelism, seed)))
            .collect();
        for run in runs {
            if let Err(panic) = run.join() {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

#[test]
fn exactly_once_with_panics_at_parallelism_1() {
    check_seeds(1);
}

#[test]
fn exactly_once_with_panics_at_parallelism_2() {
    check_seeds(2);
}

#[test]
fn exactly_once_with_panics_at_parallelism_3() {
    check_seeds(3);
}

/// Stops a job at `from` with a savepoint mid-input, resumes it at `to`:
/// the partitions are spread again and the output is exactly once.
fn check_rescale(from: usize, to: usize) {
    let Some(brokers) = broker() else { return };
    let records = 1_500;
    let partitions = 4;
    let (input, output, job_name) = (unique("in"), unique("out"), unique("job"));
    create_topic(&brokers, &input, partitions);
    create_topic(&brokers, &output, 2);
    fill(&brokers, &input, partitions, records);
    let store: Arc<dyn CheckpointStore> =
        Arc::new(MemoryCheckpointStore::new("kafka-rescale").expect("a memory store"));
    let sink = sink_factory(&brokers, &output, &job_name);
    let log = sink.commit_log();
    let seen = Arc::new(AtomicU64::new(0));
    // Small batches and windows: the paced `parse` then has few records
    // queued before a barrier, so the savepoint comes soon after it is
    // asked for.
    let first = Job::new(
        &job_name,
        JobConfig {
            batch_size_max: 4,
            window_batches: 2,
            ..job_config(Some(Arc::clone(&store)), 0)
        },
    );
    let source = source_factory(&brokers, &input, BadRecords::Fail);
    // About 1.5 s of input whatever `from` is, so that the savepoint comes
    // well before the end even on a loaded machine.
    let pause_us = 1_000 * from as u64;
    declare(
        &first,
        source,
        sink,
        from,
        1,
        &Faults::none(),
        pause_us,
        &seen,
    );
    let running = first.start().expect("the first run starts");
    let started = Instant::now();
    while seen.load(Ordering::Relaxed) < records / 10 && started.elapsed() < Duration::from_secs(20)
    {
        thread::sleep(Duration::from_millis(1));
    }
    let asked_at_seen = seen.load(Ordering::Relaxed);
    let asked = Instant::now();
    running.stop_with_savepoint();
    let stopped = running.wait().expect("the first run stops");
    let savepoint = stopped.savepoint.expect("a savepoint");
    let first_seen = seen.load(Ordering::Relaxed);
    eprintln!(
        "{from} -> {to}: savepoint asked at {asked_at_seen} records, taken at {first_seen} \
         after {} ms",
        asked.elapsed().as_millis()
    );
    assert!(
        first_seen < records,
        "{from} -> {to}: the first run stopped mid-input"
    );

    let sink = sink_factory(&brokers, &output, &job_name);
    let second_log = sink.commit_log();
    let second = Job::new(&job_name, job_config(Some(store), 0));
    let source = source_factory(&brokers, &input, BadRecords::Fail);
    let state = declare(&second, source, sink, to, 1, &Faults::none(), 0, &seen);
    let report = second
        .run()
        .expect("the job resumes at the new parallelism");
    assert_eq!(report.resumed_from, Some(savepoint), "{from} -> {to}");
    let committed: Vec<String> = log
        .committed()
        .into_iter()
        .chain(second_log.committed())
        .collect();
    let all: BTreeSet<String> = committed.into_iter().collect();
    let (want, want_state) = expected(0..records);
    let reads = read_results(&brokers, &output, &all, &want, Duration::from_millis(700));
    let got: Vec<(u64, u64)> = committed_results(&reads, &all)
        .into_iter()
        .map(|(result, _)| result)
        .collect();
    if got != want {
        eprintln!("{}", locate_missing(&reads, &all, &want));
    }
    assert_eq!(final_state(&state), want_state, "{from} -> {to}: state");
    assert!(
        got == want,
        "{from} -> {to}: committed output: {}",
        difference(&got, &want)
    );
}

#[test]
fn a_savepoint_resumes_at_more_subtasks() {
    check_rescale(1, 3);
}

#[test]
fn a_savepoint_resumes_at_fewer_subtasks() {
    check_rescale(3, 2);
}

/// Reads `topic` with a source alone and collects what it decodes.
fn read_with(
    brokers: &str,
    topic: &str,
    bad: BadRecords,
    parallelism: usize,
) -> (Result<JobReport, JobError>, Vec<u64>, DroppedRecords) {
    let source = source_factory(brokers, topic, bad);
    let dropped = source.dropped();
    let output = snapflow::sink::CollectHandle::new();
    let job = Job::new(&unique("read"), job_config(None, 2));
    job.source("in", source)
        .parallelism(parallelism)
        .sink("collect", output.clone())
        .parallelism(1);
    let report = job.run();
    let mut got = output.committed();
    got.sort_unstable();
    (report, got, dropped)
}

#[test]
fn undecodable_records_are_dropped_and_counted() {
    let Some(brokers) = broker() else { return };
    let topic = unique("bad");
    create_topic(&brokers, &topic, 2);
    let mut rows: Vec<_> = (0..40u64)
        .map(|id| ((id % 2) as i32, Vec::new(), encode_input(id)))
        .collect();
    rows.insert(5, (0, Vec::new(), b"not a number".to_vec()));
    rows.push((1, Vec::new(), vec![0xFF, 0xFE]));
    produce(&brokers, &topic, &rows);
    let (report, got, dropped) = read_with(&brokers, &topic, BadRecords::Drop, 3);
    report.expect("the job ends");
    assert_eq!(got, (0..40).collect::<Vec<_>>());
    assert_eq!(dropped.count(), 2);
}

#[test]
fn an_undecodable_record_fails_the_job_without_retrying() {
    let Some(brokers) = broker() else { return };
    let topic = unique("bad");
    create_topic(&brokers, &topic, 1);
    produce(
        &brokers,
        &topic,
        &[
            (0, Vec::new(), encode_input(1)),
            (0, Vec::new(), b"x".to_vec()),
        ],
    );
    let (report, _, _) = read_with(&brokers, &topic, BadRecords::Fail, 1);
    let error = report.expect_err("a bad record fails the job");
    let text = error.to_string();
    assert!(text.contains("does not decode"), "{text}");
    assert!(!error.is_retryable(), "{text}");
}

#[test]
fn an_empty_topic_ends_at_once_with_nothing() {
    let Some(brokers) = broker() else { return };
    let topic = unique("empty");
    create_topic(&brokers, &topic, 3);
    let (report, got, _) = read_with(&brokers, &topic, BadRecords::Fail, 2);
    report.expect("the job ends");
    assert!(got.is_empty());
}

#[test]
fn start_checks_give_typed_errors_before_records_flow() {
    let Some(brokers) = broker() else { return };
    let missing = unique("missing");
    let source =
        KafkaSourceFactory::new(KafkaSourceConfig::new(&brokers, &[&missing]), decode_input);
    assert!(matches!(source, Err(KafkaError::UnknownTopic { ref topic, .. }) if *topic == missing));
    let sink = KafkaSinkFactory::new(
        KafkaSinkConfig::new(&brokers, &missing, "job", "out"),
        encode_output as Encode,
    );
    assert!(matches!(sink, Err(KafkaError::UnknownTopic { .. })));

    // A transaction time-out too short for the job's checkpoint
    // interval: `kafka_sink.rs`.
    let topic = unique("short");
    create_topic(&brokers, &topic, 1);

    // A port nothing listens on (the broker's port plus one thousand).
    let unreachable = "127.0.0.1:1";
    let mut config = KafkaSourceConfig::new(unreachable, &[&topic]);
    config.request_timeout_ms = 1_000;
    let error = KafkaSourceFactory::new(config, decode_input)
        .err()
        .expect("no broker");
    assert!(
        matches!(error, KafkaError::BrokerUnreachable { .. }),
        "{error}"
    );
    assert!(error.is_retryable());
}

/// The sink's contract call by call: a sink pre-commits and is dropped
/// before its checkpoint's commit (as a failed subtask is); the next
/// incarnation's restore commits that transaction with the producer the
/// process kept, a second commit changes nothing, and the records carry
/// the committed transaction's header.
#[test]
fn a_restore_commits_what_a_failed_sink_pre_committed() {
    let Some(brokers) = broker() else { return };
    let (output, job_name) = (unique("out"), unique("job"));
    create_topic(&brokers, &output, 1);
    let factory = sink_factory(&brokers, &output, &job_name);
    let log = factory.commit_log();
    let mut failed = factory.create(0, 1).expect("a sink");
    failed.restore(None).expect("a fresh start");
    failed.write_batch(&[(1, 1), (2, 1)]).expect("written");
    let state = failed.pre_commit(1).expect("pre-committed");
    failed
        .write_batch(&[(3, 1)])
        .expect("written after the checkpoint");
    drop(failed);
    assert!(
        log.committed().is_empty(),
        "nothing is committed before its checkpoint"
    );

    let mut restored = factory.create(0, 1).expect("a sink");
    let visibility = restored
        .check_restore(Some(1), Some(&state))
        .expect("the state checks");
    // The marker shows nothing committed after checkpoint 1.
    assert_eq!(visibility, Visibility::Known(Vec::new()));
    restored.restore(Some(&state)).expect("the restore commits");
    restored.commit(1).expect("a second commit changes nothing");
    let committed = log.committed();
    assert_eq!(committed.len(), 1, "{committed:?}");
    assert_eq!((log.recovered(), log.rewritten()), (0, 0));
    let (got, total) = committed_output(&brokers, &output, &log, &[(1, 1), (2, 1)]);
    assert_eq!(got, [(1, 1), (2, 1)]);
    // The record written after the checkpoint was in the open
    // transaction, still in the producer's queue: dropping the failed
    // sink aborted the transaction, which purged it before it reached
    // the broker.
    assert_eq!(total, 2);

    let mut wrong = factory.create(1, 2).expect("a sink");
    let error = wrong
        .restore(Some(&state))
        .expect_err("another subtask's state");
    assert!(matches!(error, SinkError::WrongSubtask { .. }), "{error}");
    let error = wrong
        .restore(Some(&SinkState::from_bytes(vec![1, 2, 3])))
        .expect_err("bytes the sink did not write");
    assert!(matches!(error, SinkError::MalformedState { .. }), "{error}");
}

/// Reads `topic` from `start` with a bounded source at parallelism 2.
fn read_from(brokers: &str, topic: &str, start: StartFrom) -> Vec<u64> {
    let mut config = KafkaSourceConfig::new(brokers, &[topic]);
    config.bounded = true;
    config.start = start;
    let source = KafkaSourceFactory::new(config, decode_input as Decode).expect("a source");
    let output = snapflow::sink::CollectHandle::new();
    let job = Job::new(&unique("read"), job_config(None, 0));
    job.source("in", source)
        .parallelism(2)
        .sink("collect", output.clone())
        .parallelism(1);
    job.run().expect("the job ends");
    let mut got = output.committed();
    got.sort_unstable();
    got
}

#[test]
fn a_source_starts_at_the_earliest_the_latest_or_a_timestamp() {
    let Some(brokers) = broker() else { return };
    let topic = unique("start");
    create_topic(&brokers, &topic, 1);
    let rows = |ids: std::ops::Range<u64>| -> Vec<_> {
        ids.map(|id| (0, Vec::new(), encode_input(id))).collect()
    };
    produce(&brokers, &topic, &rows(0..5));
    thread::sleep(Duration::from_millis(50));
    let between_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64;
    thread::sleep(Duration::from_millis(50));
    produce(&brokers, &topic, &rows(5..10));
    assert_eq!(
        read_from(&brokers, &topic, StartFrom::Earliest),
        (0..10).collect::<Vec<_>>()
    );
    assert!(read_from(&brokers, &topic, StartFrom::Latest).is_empty());
    assert_eq!(
        read_from(&brokers, &topic, StartFrom::TimestampMs(between_ms)),
        (5..10).collect::<Vec<_>>()
    );
}

/// Every `(key, count)` record of `topic`, sorted, read until each of
/// `want` (sorted) is there at least once.
fn every_result(brokers: &str, topic: &str, want: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let parse = |read: &support::Read| -> Option<(u64, u64)> {
        let text = std::str::from_utf8(&read.value).ok()?;
        let (key, count) = text.split_once(':')?;
        Some((key.parse().ok()?, count.parse().ok()?))
    };
    let all = support::read_until(
        brokers,
        topic,
        "read_uncommitted",
        Duration::from_millis(700),
        |reads| {
            let got: BTreeSet<(u64, u64)> = reads.iter().filter_map(parse).collect();
            want.iter().all(|result| got.contains(result))
        },
    );
    let mut got: Vec<(u64, u64)> = all.iter().filter_map(parse).collect();
    got.sort_unstable();
    got
}

/// The sink at `delivery` (not exactly-once), at `parallelism`, with one
/// panic when `panic` says so: the state equals the direct computation,
/// and the output holds every result, at least once after a restart
/// (the at-least-once mode writes again what the restored checkpoint did
/// not cover), exactly once without one.
fn check_delivery(delivery: Delivery, parallelism: usize, panic: bool) {
    let Some(brokers) = broker() else { return };
    quiet_injected_panics();
    let what = format!("{delivery:?} at parallelism {parallelism}, panic {panic}");
    let records = 200;
    let (input, output, job_name) = (unique("in"), unique("out"), unique("job"));
    create_topic(&brokers, &input, 3);
    create_topic(&brokers, &output, 2);
    fill(&brokers, &input, 3, records);
    let faults = Faults::new(if panic {
        vec![("parse", records / 2, FaultKind::Panic)]
    } else {
        Vec::new()
    });
    let mut config = KafkaSinkConfig::new(&brokers, &output, &job_name, "out");
    config.delivery = delivery;
    let sink = KafkaSinkFactory::new(config, encode_output as Encode).expect("the sink's checks");
    let (report, state) = run_count(
        (&brokers, &input, &job_name),
        sink,
        parallelism,
        &faults,
        200,
    )
    .unwrap_or_else(|error| panic!("{what}: the job failed: {error}"));
    let (want, want_state) = expected(0..records);
    assert_eq!(final_state(&state), want_state, "{what}: state");
    let got = every_result(&brokers, &output, &want);
    let distinct: Vec<(u64, u64)> = got
        .iter()
        .copied()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(distinct == want, "{what}: {}", difference(&distinct, &want));
    assert_eq!(report.restarts.is_empty(), !panic, "{what}: restarts");
    if !panic {
        assert!(got == want, "{what}: {}", difference(&got, &want));
    }
    eprintln!(
        "{what}: {} results written for {} wanted, {} restarts",
        got.len(),
        want.len(),
        report.restarts.len()
    );
}

#[test]
fn at_least_once_loses_nothing_across_a_restart() {
    for parallelism in 1..=3 {
        check_delivery(Delivery::AtLeastOnce, parallelism, true);
    }
}

#[test]
fn delivery_none_writes_each_result_once_without_failures() {
    for parallelism in 1..=3 {
        check_delivery(Delivery::None, parallelism, false);
    }
}
