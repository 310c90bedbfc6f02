//! The `snapflow` tool on a real store: a keyed job writes checkpoints,
//! then the binary lists, shows and verifies them, as text and as JSON,
//! and finds a checkpoint damaged by a flipped byte. `show` decodes what
//! the parts hold: source positions (a built-in source's index, a Kafka
//! source's offsets per partition, against a broker when
//! `SNAPFLOW_KAFKA_BROKERS` names one), sink states (pending
//! transactions, the file sink's staged files with their sizes and
//! checksums) and the stored schema of keyed and windowed state. Paths that are not a
//! store, unknown jobs and bad arguments give clear errors.

use std::path::Path;
use std::process::{Command, Output};

// The Kafka tests' helpers (topics, records, finding the broker).
#[path = "../../tests/tests/kafka/support.rs"]
mod kafka;

use snapflow::connectors::kafka::{KafkaRecord, KafkaSourceConfig, KafkaSourceFactory};
use snapflow::job::{Job, JobConfig};
use snapflow::sink::{committed_files, CollectHandle, FileSinkFactory, DEFAULT_PREFIX};
use snapflow::source::VecSourceFactory;
use snapflow::time::{WatermarkStrategy, Windows};
use snapflow::Snapshot;

#[derive(Snapshot, Default, Clone, Debug)]
struct Tally {
    seen: u64,
}

/// Runs a keyed job at `parallelism` with checkpoints into `root`.
fn run_job(root: &Path, parallelism: usize) {
    let config = JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: parallelism,
        // Small batches and a short window keep the source close to the
        // operators, so barriers do not queue behind the whole input:
        // several periodic checkpoints complete while it runs, not one as
        // it ends (which the final checkpoint would then subsume).
        batch_size_max: 16,
        window_batches: 2,
        ..JobConfig::default()
    }
    .with_store_dir(root, "tally")
    .expect("the store opens");
    let job = Job::new("tally", config);
    job.source("numbers", VecSourceFactory::new((0..2_000_u64).collect()))
        // Slow enough (about 200 ms in all) for several periodic
        // checkpoints to complete before the final one.
        .map("pace", |n: u64| {
            std::thread::sleep(std::time::Duration::from_micros(100));
            n
        })
        .key_by(|n: &u64| n % 7)
        .process("count", |_key: &u64, tally: &mut Tally, _n: u64, out| {
            tally.seen += 1;
            out.emit(tally.seen);
            Ok(())
        })
        .sink("out", CollectHandle::new());
    job.run().expect("the job runs");
}

fn snapflow(arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapflow"))
        .args(arguments)
        .output()
        .expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout).expect("the output is JSON")
}

/// The newest checkpoint's id, from `list --json`.
fn newest_id(root: &str) -> u64 {
    let listing = json(&snapflow(&["list", root, "--json"]));
    listing[0]["entries"]
        .as_array()
        .and_then(|entries| entries.last())
        .and_then(|entry| entry["id"].as_u64())
        .expect("the job has a checkpoint")
}

fn check(parallelism: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_job(dir.path(), parallelism);
    let root = dir.path().to_str().expect("a UTF-8 path");

    let listed = snapflow(&["list", root]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("job tally"), "{}", stdout(&listed));
    let id = newest_id(root);

    let shown = snapflow(&["show", root, "tally", &id.to_string(), "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown = json(&shown);
    assert_eq!(shown["job"], "tally");
    assert_eq!(shown["operators"]["count"], parallelism as u64);
    let parts = shown["parts"].as_array().expect("parts");
    let counts: Vec<_> = parts
        .iter()
        .filter(|part| part["operator"] == "count")
        .collect();
    assert_eq!(counts.len(), parallelism);
    let entries: u64 = counts
        .iter()
        .map(|part| {
            assert_eq!(part["state"]["layout"], "keyed", "{part}");
            assert_eq!(part["state"]["schemas"][0]["fields"][0], "seen: u64");
            part["state"]["entries"].as_u64().expect("entries")
        })
        .sum();
    assert_eq!(entries, 7, "one entry per key over the subtasks");
    check_source_and_sink(&shown, parallelism);
    let text = stdout(&snapflow(&["show", root, "tally", &id.to_string()]));
    assert!(text.contains("part count[0]"), "{text}");
    assert!(text.contains("keyed:"), "{text}");
    assert!(
        text.contains("source position numbers[0]: next record or offset "),
        "{text}"
    );
    assert!(
        text.contains("state: sink state of subtask 0: pending checkpoints"),
        "{text}"
    );
    assert!(
        !text.contains("unknown format"),
        "every part decodes: {text}"
    );

    let verified = snapflow(&["verify", root, "tally"]);
    assert!(verified.status.success(), "{}", stdout(&verified));
    assert!(stdout(&verified).contains(&format!("checkpoint {id}: OK")));

    let directory = shown["directory"].as_str().expect("the directory");
    damage_a_part(Path::new(directory));
    let alone = snapflow(&["show", "--dir", directory]);
    assert_eq!(
        alone.status.code(),
        Some(1),
        "a damaged checkpoint does not show"
    );
    let verified = snapflow(&["verify", root, "tally", &id.to_string(), "--json"]);
    assert_eq!(
        verified.status.code(),
        Some(1),
        "a damaged checkpoint fails"
    );
    let verdicts = json(&verified)["checkpoints"].clone();
    assert_eq!(verdicts[0]["ok"], false);
    let problem = verdicts[0]["problem"].as_str().expect("a reason");
    assert!(
        problem.contains("count"),
        "the reason names the part: {problem}"
    );
}

/// The final checkpoint of the keyed job: every source subtask's
/// position is its next index (the last one's is the input's end), in
/// the metadata and in its part, and the collect sink's parts list their
/// pending checkpoints.
fn check_source_and_sink(shown: &serde_json::Value, parallelism: usize) {
    let positions = shown["source_positions"]
        .as_object()
        .expect("source positions");
    assert_eq!(positions.len(), parallelism);
    let nexts: Vec<u64> = positions
        .values()
        .map(|position| {
            assert_eq!(position["format"], "index", "{position}");
            position["next"].as_u64().expect("a number")
        })
        .collect();
    assert_eq!(nexts.iter().max(), Some(&2_000), "{nexts:?}");
    let parts = shown["parts"].as_array().expect("parts");
    for part in parts.iter().filter(|part| part["operator"] == "numbers") {
        let name = format!("numbers[{}]", part["subtask"]);
        assert_eq!(part["state"]["layout"], "source", "{part}");
        assert_eq!(part["state"]["position"], positions[&name], "{part}");
    }
    let sinks: Vec<_> = parts
        .iter()
        .filter(|part| part["operator"] == "out")
        .collect();
    assert_eq!(sinks.len(), parallelism);
    for part in sinks {
        let state = &part["state"];
        assert_eq!(state["layout"], "sink_pending", "{part}");
        assert_eq!(state["subtask"], part["subtask"], "{part}");
        assert!(state["pending_checkpoints"].is_array(), "{part}");
    }
}

/// Flips one byte of a part file of `count` in the checkpoint directory
/// `checkpoint`.
fn damage_a_part(checkpoint: &Path) {
    let part = walk(checkpoint)
        .into_iter()
        .find(|path| path.to_string_lossy().contains("op-count"))
        .expect("a part of `count`");
    let mut bytes = std::fs::read(&part).expect("the part reads");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&part, bytes).expect("the part writes");
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("reads") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn list_show_and_verify_a_real_store_at_parallelism_1() {
    check(1);
}

#[test]
fn list_show_and_verify_a_real_store_at_parallelism_2() {
    check(2);
}

#[test]
fn list_show_and_verify_a_real_store_at_parallelism_3() {
    check(3);
}

/// A windowed job stopped with a savepoint while windows are open: its
/// window parts show as timed state, with keys, timers and a watermark.
#[test]
fn a_window_operators_state_shows_its_keys_and_timers() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    // Small batches: the source cannot read far ahead of the paced map,
    // so the savepoint comes long before the end of input.
    let config = JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: 2,
        batch_size_max: 16,
        ..JobConfig::default()
    }
    .with_store_dir(dir.path(), "windows")
    .expect("the store opens");
    let job = Job::new("windows", config);
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = std::sync::Arc::clone(&seen);
    let (counts, _late) = job
        .source("numbers", VecSourceFactory::new((0..20_000_u64).collect()))
        .assign_timestamps(WatermarkStrategy::monotonous(|n: &u64| *n))
        .map("pace", move |n: u64| {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(std::time::Duration::from_micros(50));
            n
        })
        .key_by(|n: &u64| n % 5)
        .window(
            Windows::tumbling(1_000).expect("a valid size"),
            |n: &u64| *n,
        )
        .count("window");
    counts.sink("out", CollectHandle::new());
    let running = job.start().expect("the job starts");
    while seen.load(std::sync::atomic::Ordering::Relaxed) < 1_500 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    running.stop_with_savepoint();
    let stopped = running.wait().expect("the job stops");
    let id = stopped.savepoint.expect("a savepoint");
    let root = dir.path().to_str().expect("a UTF-8 path");
    let shown = snapflow(&["show", root, "windows", &id.to_string(), "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown = json(&shown);
    let windows: Vec<_> = shown["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|part| part["operator"] == "window")
        .collect();
    assert_eq!(windows.len(), 2, "one part per subtask");
    let (mut keys, mut with_timers) = (0, 0);
    for part in &windows {
        let state = &part["state"];
        assert_eq!(state["layout"], "timed", "{part}");
        assert!(state["watermark_ms"].as_u64().is_some(), "{part}");
        keys += state["entries"].as_u64().expect("entries");
        with_timers += state["keys_with_timers"]
            .as_u64()
            .expect("keys with timers");
    }
    assert_eq!(keys, 5, "every key has an open window: {windows:?}");
    assert_eq!(
        with_timers, 5,
        "every key with an open window has its timers"
    );
    for part in &windows {
        let fields = &part["state"]["schemas"][0]["fields"];
        assert!(
            fields.as_array().is_some_and(|fields| !fields.is_empty()),
            "the open windows' stored schema: {part}"
        );
    }
    let text = stdout(&snapflow(&["show", root, "windows", &id.to_string()]));
    assert!(text.contains("timed: "), "{text}");
    assert!(text.contains(" v1 { "), "the schema as text: {text}");
    assert!(
        !text.contains("unknown format"),
        "every part decodes: {text}"
    );
}

/// A job into the file sink: its parts show the staged files with the
/// size and CRC-32 of each, which equal the committed files'.
#[test]
fn a_file_sinks_state_shows_its_staged_files() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = tempfile::tempdir().expect("a temporary directory");
    let config = JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: 2,
        ..JobConfig::default()
    }
    .with_store_dir(dir.path(), "files")
    .expect("the store opens");
    let job = Job::new("files", config);
    job.source("numbers", VecSourceFactory::new((0..2_000_u64).collect()))
        .map("pace", |n: u64| {
            std::thread::sleep(std::time::Duration::from_micros(50));
            n.to_string()
        })
        .sink(
            "files",
            FileSinkFactory::lines(output.path()).expect("a sink"),
        );
    job.run().expect("the job runs");
    let root = dir.path().to_str().expect("a UTF-8 path");
    let committed = committed_files(output.path(), DEFAULT_PREFIX).expect("listed");
    let mut staged_seen = 0;
    for id in ids(root) {
        let shown = json(&snapflow(&[
            "show",
            root,
            "files",
            &id.to_string(),
            "--json",
        ]));
        let sinks = shown["parts"].as_array().expect("parts").clone();
        for part in sinks.iter().filter(|part| part["operator"] == "files") {
            let state = &part["state"];
            assert_eq!(state["layout"], "sink_staged_files", "{part}");
            assert_eq!(state["subtask"], part["subtask"]);
            for file in state["files"].as_array().expect("files") {
                let name = format!(
                    "{DEFAULT_PREFIX}-{}-{}",
                    part["subtask"], file["checkpoint"]
                );
                let path = committed
                    .iter()
                    .find(|path| {
                        path.file_name()
                            .is_some_and(|n| n.to_string_lossy() == name)
                    })
                    .unwrap_or_else(|| panic!("{name} is committed: {committed:?}"));
                let bytes = std::fs::read(path).expect("reads");
                assert_eq!(file["bytes"], bytes.len() as u64, "{name}");
                assert_eq!(
                    file["crc32"],
                    format!("{:08x}", crc32fast::hash(&bytes)),
                    "{name}"
                );
                staged_seen += 1;
            }
        }
        let text = stdout(&snapflow(&["show", root, "files", &id.to_string()]));
        assert!(
            text.contains("file sink state of subtask 1: staged files "),
            "{text}"
        );
    }
    assert!(staged_seen > 0, "some checkpoint lists a staged file");
}

fn value_of(record: &KafkaRecord<'_>) -> Result<Vec<u8>, String> {
    Ok(record.value().unwrap_or_default().to_vec())
}

/// A bounded Kafka source over two partitions: the final checkpoint
/// shows each partition's next offset (and end), which add up to the
/// records written. Needs a broker (`SNAPFLOW_KAFKA_BROKERS`): skipped
/// outside CI with a message, a failure in CI.
#[test]
fn a_kafka_sources_position_shows_each_partitions_next_offset() {
    let Some(brokers) = kafka::broker() else {
        return;
    };
    let topic = kafka::unique("cli-in");
    kafka::create_topic(&brokers, &topic, 2);
    let rows: Vec<(i32, Vec<u8>, Vec<u8>)> = (0..30_u32)
        .map(|n| ((n % 2) as i32, Vec::new(), n.to_string().into_bytes()))
        .collect();
    kafka::produce(&brokers, &topic, &rows);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let name = kafka::unique("cli-job");
    let config = JobConfig {
        checkpoint_interval_ms: Some(50),
        ..JobConfig::default()
    }
    .with_store_dir(dir.path(), &name)
    .expect("the store opens");
    let mut source = KafkaSourceConfig::new(&brokers, &[&topic]);
    source.bounded = true;
    let source = KafkaSourceFactory::new(source, value_of).expect("the source's checks pass");
    let job = Job::new(&name, config);
    job.source("kafka", source)
        .sink("out", CollectHandle::new());
    job.run().expect("the job runs");
    let root = dir.path().to_str().expect("a UTF-8 path");
    let id = newest_id(root);
    let shown = snapflow(&["show", root, &name, &id.to_string(), "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let shown = json(&shown);
    let position = &shown["source_positions"]["kafka[0]"];
    assert_eq!(position["format"], "kafka", "{shown}");
    let partitions = position["partitions"].as_array().expect("partitions");
    assert_eq!(partitions.len(), 2, "{position}");
    for (index, place) in partitions.iter().enumerate() {
        assert_eq!(place["topic"], topic.as_str());
        assert_eq!(place["partition"], index as u64);
        assert_eq!(place["next_offset"], 15, "every record read: {place}");
        assert_eq!(place["end_offset"], 15, "bounded at the end: {place}");
    }
    let text = stdout(&snapflow(&["show", root, &name, &id.to_string()]));
    let expected = format!("kafka: {topic}/0 -> next offset 15 (end 15), {topic}/1 -> next");
    assert!(text.contains(&expected), "{text}");
}

/// An exactly-once Kafka sink at parallelism 2: the final checkpoint
/// shows each subtask's pending transaction, under a header the sink
/// committed, and together they hold every record written after the
/// checkpoint before. Needs a broker, as above.
#[test]
fn a_kafka_sinks_state_shows_its_pending_transactions() {
    use snapflow::connectors::kafka::{KafkaOut, KafkaSinkConfig, KafkaSinkFactory};
    let Some(brokers) = kafka::broker() else {
        return;
    };
    let topic = kafka::unique("cli-out");
    kafka::create_topic(&brokers, &topic, 2);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let name = kafka::unique("cli-job");
    let config = JobConfig {
        // No periodic checkpoint: the final one holds every record.
        checkpoint_interval_ms: None,
        default_parallelism: 2,
        ..JobConfig::default()
    }
    .with_store_dir(dir.path(), &name)
    .expect("the store opens");
    let encode = |n: &u64| KafkaOut {
        key: None,
        value: n.to_string().into_bytes(),
        partition: Some((n % 2) as i32),
        timestamp_ms: None,
    };
    let sink = KafkaSinkFactory::new(KafkaSinkConfig::new(&brokers, &topic, &name, "out"), encode)
        .expect("the sink's checks pass");
    let log = sink.commit_log();
    let job = Job::new(&name, config);
    job.source("numbers", VecSourceFactory::new((0..40_u64).collect()))
        .sink("out", sink);
    job.run().expect("the job runs");
    let root = dir.path().to_str().expect("a UTF-8 path");
    let id = newest_id(root);
    let shown = json(&snapflow(&["show", root, &name, &id.to_string(), "--json"]));
    let committed = log.committed();
    let mut records = 0;
    let sinks: Vec<_> = shown["parts"]
        .as_array()
        .expect("parts")
        .iter()
        .filter(|part| part["operator"] == "out")
        .cloned()
        .collect();
    assert_eq!(sinks.len(), 2, "{shown}");
    for part in &sinks {
        let state = &part["state"];
        assert_eq!(state["layout"], "sink_kafka", "{part}");
        assert_eq!(state["subtask"], part["subtask"]);
        for txn in state["pending"].as_array().expect("pending") {
            assert_eq!(txn["checkpoint"], id, "{txn}");
            let header = txn["header"].as_str().expect("a header");
            assert!(committed.iter().any(|c| c == header), "{header} committed");
            records += txn["records"].as_u64().expect("records");
        }
    }
    assert_eq!(records, 40, "the pending transactions hold every record");
    let text = stdout(&snapflow(&["show", root, &name, &id.to_string()]));
    assert!(
        text.contains("Kafka sink state of subtask 0: next transaction after checkpoint"),
        "{text}"
    );
}

#[test]
fn paths_that_are_not_a_store_and_unknown_jobs_are_clear_errors() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let root = dir.path().to_str().expect("a UTF-8 path");
    let empty = snapflow(&["list", root]);
    assert_eq!(empty.status.code(), Some(1));
    assert!(
        stderr(&empty).contains("is not a snapflow store"),
        "{}",
        stderr(&empty)
    );
    let missing = snapflow(&["list", &format!("{root}/nowhere")]);
    assert!(
        stderr(&missing).contains("no such directory"),
        "{}",
        stderr(&missing)
    );
    run_job(dir.path(), 1);
    let unknown = snapflow(&["verify", root, "other"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        stderr(&unknown).contains("has no job \"other\" (it has: tally)"),
        "{}",
        stderr(&unknown)
    );
    let usage = snapflow(&["show", root, "tally", "twelve"]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(
        stderr(&usage).contains("a checkpoint id is a number"),
        "{}",
        stderr(&usage)
    );
    assert_eq!(snapflow(&["frobnicate"]).status.code(), Some(2));
}

/// `--help` describes every command and flag; a flag the tool does not
/// know is a usage error (exit code 2) that names it.
#[test]
fn help_describes_the_commands_and_a_bad_flag_is_a_usage_error() {
    let help = snapflow(&["--help"]);
    assert!(help.status.success(), "{}", stderr(&help));
    for word in ["list", "show", "verify", "delete", "prune", "--json"] {
        assert!(stdout(&help).contains(word), "{word}: {}", stdout(&help));
    }
    let prune = snapflow(&["prune", "--help"]);
    assert!(prune.status.success(), "{}", stderr(&prune));
    assert!(stdout(&prune).contains("--keep <N>"), "{}", stdout(&prune));
    let show = snapflow(&["show", "--help"]);
    assert!(
        stdout(&show).contains("--dir <CHECKPOINT_DIR>"),
        "{}",
        stdout(&show)
    );

    let bad = snapflow(&["list", "some-store", "--frobnicate"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("unexpected argument '--frobnicate'"),
        "{}",
        stderr(&bad)
    );
    let missing = snapflow(&["prune", "some-store", "tally"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        stderr(&missing).contains("--keep <N>"),
        "{}",
        stderr(&missing)
    );
}

/// The ids of the checkpoints `list --json` shows for the job.
fn ids(root: &str) -> Vec<u64> {
    let listing = json(&snapflow(&["list", root, "--json"]));
    listing[0]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["id"].as_u64().expect("an id"))
        .collect()
}

#[test]
fn delete_keeps_the_newest_checkpoint_unless_forced_and_prune_keeps_n() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_job(dir.path(), 2);
    let root = dir.path().to_str().expect("a UTF-8 path");
    let before = ids(root);
    assert!(before.len() >= 2, "retention keeps several: {before:?}");
    let newest = *before.last().expect("a newest");
    let refused = snapflow(&["delete", root, "tally", &newest.to_string()]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("add --force"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(ids(root), before, "nothing was deleted");

    let oldest = before[0];
    let deleted = snapflow(&["delete", root, "tally", &oldest.to_string(), "--json"]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    assert_eq!(json(&deleted)["deleted"][0], oldest);
    assert_eq!(ids(root), before[1..]);
    let again = snapflow(&["delete", root, "tally", &oldest.to_string()]);
    assert!(
        stderr(&again).contains("does not exist"),
        "{}",
        stderr(&again)
    );

    let pruned = snapflow(&["prune", root, "tally", "--keep", "1"]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    assert_eq!(ids(root), [newest]);
    let verified = snapflow(&["verify", root, "tally"]);
    assert!(verified.status.success(), "what is left verifies");
    assert_eq!(
        snapflow(&["prune", root, "tally", "--keep", "0"])
            .status
            .code(),
        Some(2)
    );

    let forced = snapflow(&["delete", root, "tally", &newest.to_string(), "--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(ids(root).is_empty());
}

/// `verify` follows every reference: a flipped byte in a shared file of
/// the incremental checkpoints (outside every checkpoint's directory)
/// makes each checkpoint that refers to it damaged, naming the file.
#[test]
fn verify_finds_a_damaged_shared_file_that_checkpoints_refer_to() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_job(dir.path(), 2);
    let root = dir.path().to_str().expect("a UTF-8 path");
    let verified = snapflow(&["verify", root, "tally"]);
    assert!(verified.status.success(), "{}", stdout(&verified));
    let shared: Vec<_> = walk(dir.path())
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "shared"))
        .collect();
    let file = shared
        .first()
        .expect("incremental checkpoints wrote shared files");
    let mut bytes = std::fs::read(file).expect("the shared file reads");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(file, bytes).expect("the shared file writes");
    let verified = snapflow(&["verify", root, "tally", "--json"]);
    assert_eq!(verified.status.code(), Some(1), "{}", stdout(&verified));
    let verdicts = json(&verified)["checkpoints"].clone();
    let name = file
        .file_name()
        .and_then(|name| name.to_str())
        .expect("a name");
    let damaged: Vec<_> = verdicts
        .as_array()
        .expect("verdicts")
        .iter()
        .filter(|verdict| verdict["ok"] == false)
        .collect();
    assert!(!damaged.is_empty(), "{verdicts}");
    for verdict in damaged {
        let problem = verdict["problem"].as_str().expect("a reason");
        assert!(problem.contains(name), "the reason names {name}: {problem}");
    }
}

/// A store that a job (here, this test process) owns can be listed and
/// verified, but not changed: `delete` and `prune` are refused with the
/// store's `StoreInUse`, naming the owner's pid, and delete nothing.
/// Once the owner lets go, `prune` works.
#[test]
fn an_owned_store_is_read_but_not_changed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_job(dir.path(), 2);
    let root = dir.path().to_str().expect("a UTF-8 path");
    let before = ids(root);
    assert!(before.len() >= 2, "retention keeps several: {before:?}");
    let owner = snapflow::storage::FsCheckpointStore::open(dir.path(), "tally")
        .expect("this process owns the store");
    let verified = snapflow(&["verify", root, "tally"]);
    assert!(verified.status.success(), "{}", stderr(&verified));
    let pid = format!("pid {} ", std::process::id());
    for refused in [
        snapflow(&["prune", root, "tally", "--keep", "1"]),
        snapflow(&["delete", root, "tally", &before[0].to_string()]),
    ] {
        assert!(!refused.status.success(), "a change went through");
        let message = stderr(&refused);
        assert!(
            message.contains("is in use by another process") && message.contains(&pid),
            "{message}"
        );
    }
    assert_eq!(ids(root), before, "nothing was deleted");
    drop(owner);
    let pruned = snapflow(&["prune", root, "tally", "--keep", "1"]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    assert_eq!(ids(root).len(), 1);
}

/// `verify` of a whole job lists its leftovers, each as such: a savepoint
/// that never committed, a checkpoint set aside as damaged and a shared
/// file nothing refers to leave it successful (they are not restore
/// points); an entry whose metadata does not read fails it.
#[test]
fn verify_reports_leftovers() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    run_job(dir.path(), 1);
    let root = dir.path().to_str().expect("a UTF-8 path");
    let job_dir = dir.path().join("job-tally");
    let incomplete = job_dir.join(format!("savepoints/sp-{:020}", 990));
    std::fs::create_dir_all(incomplete.join("op-count")).expect("a directory");
    std::fs::write(incomplete.join("op-count/0.part"), b"half").expect("a part");
    let aside = job_dir.join(format!("checkpoints/chk-{:020}.damaged-1700000000000", 991));
    std::fs::create_dir_all(&aside).expect("a directory");
    let unreferenced = job_dir.join(format!("shared/op-count/0-{:020}.shared", 992));
    std::fs::create_dir_all(unreferenced.parent().expect("a parent")).expect("a directory");
    std::fs::write(&unreferenced, b"nobody reads me").expect("a shared file");

    let verified = snapflow(&["verify", root, "tally"]);
    let text = stdout(&verified);
    assert!(verified.status.success(), "leftovers do not fail: {text}");
    for expected in [
        "leftover: incomplete savepoint 990",
        "leftover: checkpoint 991 set aside",
        "leftover: unreferenced shared file",
    ] {
        assert!(text.contains(expected), "{expected:?} in {text}");
    }
    let document = json(&snapflow(&["verify", root, "tally", "--json"]));
    let leftovers = document["leftovers"].as_array().expect("leftovers");
    let kinds: Vec<(&str, Option<u64>)> = leftovers
        .iter()
        .map(|row| (row["kind"].as_str().expect("a kind"), row["id"].as_u64()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("incomplete", Some(990)),
            ("set aside", Some(991)),
            ("unreferenced shared file", None)
        ],
        "{document}"
    );
    assert!(document["checkpoints"]
        .as_array()
        .expect("verdicts")
        .iter()
        .all(|verdict| verdict["ok"] == true));

    let unreadable = job_dir.join(format!("checkpoints/chk-{:020}", 993));
    std::fs::create_dir_all(&unreadable).expect("a directory");
    std::fs::write(unreadable.join("_metadata"), b"not metadata").expect("metadata");
    let verified = snapflow(&["verify", root, "tally"]);
    assert_eq!(verified.status.code(), Some(1), "{}", stdout(&verified));
    assert!(
        stdout(&verified).contains("checkpoint 993: DAMAGED"),
        "{}",
        stdout(&verified)
    );
}

/// Runs the binary with the S3 server's endpoint and credentials.
fn snapflow_s3(endpoint: &str, arguments: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_snapflow"))
        .args(arguments)
        .env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", "snapflow")
        .env("AWS_SECRET_ACCESS_KEY", "snapflow")
        .env("AWS_REGION", "us-east-1")
        .output()
        .expect("the binary runs")
}

/// The tool on checkpoints on object storage (moto from `.ci/s3.sh`):
/// `list`, `show`, `verify` and `prune` take an `s3://` location as they
/// take a directory, and a missing bucket is a clear error.
#[test]
fn list_show_verify_and_prune_on_s3() {
    use snapflow::storage::{ObjectCheckpointStore, S3Settings, StoreOptions};
    use snapflow_tests::servers::{server_from_env, unique_name};
    use snapflow_tests::tansu::{create_bucket, S3_ENDPOINT_VAR};

    let Some(endpoint) = server_from_env(S3_ENDPOINT_VAR, "S3 checkpoint", ".ci/s3.sh") else {
        return;
    };
    let bucket = unique_name("cli", '-').to_lowercase();
    create_bucket(&endpoint, &bucket);
    let root = format!("s3://{bucket}/checkpoints");
    let settings = S3Settings {
        endpoint: Some(endpoint.clone()),
        access_key_id: Some("snapflow".to_string()),
        secret_access_key: Some("snapflow".to_string()),
        ..S3Settings::default()
    };
    let store = ObjectCheckpointStore::open_s3(&root, "tally", StoreOptions::default(), &settings)
        .expect("the store opens");
    let config = JobConfig {
        checkpoint_interval_ms: Some(20),
        default_parallelism: 2,
        batch_size_max: 16,
        window_batches: 2,
        store: Some(std::sync::Arc::new(store)),
        ..JobConfig::default()
    };
    let job = Job::new("tally", config);
    job.source("numbers", VecSourceFactory::new((0..2_000_u64).collect()))
        .map("pace", |n: u64| {
            std::thread::sleep(std::time::Duration::from_micros(300));
            n
        })
        .key_by(|n: &u64| n % 7)
        .process("count", |_key: &u64, tally: &mut Tally, _n: u64, out| {
            tally.seen += 1;
            out.emit(tally.seen);
            Ok(())
        })
        .sink("out", CollectHandle::new());
    job.run().expect("the job runs");

    let listed = snapflow_s3(&endpoint, &["list", &root, "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let listing = json(&listed);
    assert_eq!(listing[0]["job"], "tally", "{listing}");
    let ids: Vec<u64> = listing[0]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|entry| entry["id"].as_u64().expect("an id"))
        .collect();
    assert!(!ids.is_empty(), "{listing}");
    let newest = ids.last().expect("a newest").to_string();
    let shown = snapflow_s3(&endpoint, &["show", &root, "tally", &newest, "--json"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    assert!(stdout(&shown).contains("count"), "{}", stdout(&shown));
    let verified = snapflow_s3(&endpoint, &["verify", &root, "tally"]);
    assert!(verified.status.success(), "{}", stdout(&verified));
    let pruned = snapflow_s3(
        &endpoint,
        &["prune", &root, "tally", "--keep", "1", "--json"],
    );
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    let after = json(&snapflow_s3(&endpoint, &["list", &root, "--json"]));
    assert_eq!(
        after[0]["entries"].as_array().map(Vec::len),
        Some(1),
        "{after}"
    );
    assert_eq!(after[0]["entries"][0]["id"].as_u64(), ids.last().copied());

    let missing = format!("s3://{}/x", unique_name("missing", '-').to_lowercase());
    let refused = snapflow_s3(&endpoint, &["list", &missing]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        stderr(&refused).contains("bucket does not exist"),
        "{}",
        stderr(&refused)
    );
}
