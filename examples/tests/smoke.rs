//! Every example in smoke mode (tiny input, one injected crash), through
//! the same `run` function its `main` calls: each must pass its own check.
//! Each test uses its own temporary checkpoint directory, so they can run
//! in parallel. wordcount_postgres needs the server `.ci/run` starts
//! (`SNAPFLOW_POSTGRES_URL`); without it that test says how to start one
//! and passes, except in CI (`CI=true`), where it fails.

use snapflow::connectors::postgres::Mode;
use snapflow_examples::common::{CommonOptions, CrashSpec, ExampleError, ExampleOptions};
use snapflow_examples::{
    bank, bank_snapshots, clickstream, dedup, online_model, wordcount, wordcount_postgres,
};

fn check<O>(
    mut options: O,
    common: impl FnOnce(&mut O) -> &mut CommonOptions,
    run: fn(&O) -> Result<(), ExampleError>,
) {
    let directory = tempfile::tempdir().expect("a temporary directory");
    common(&mut options).checkpoint_root = directory.path().to_path_buf();
    if let Err(error) = run(&options) {
        panic!("the example failed: {error}");
    }
}

#[test]
fn wordcount_smoke() {
    check(
        wordcount::Options::smoke(),
        |options| &mut options.common,
        wordcount::run,
    );
}

#[test]
fn wordcount_input_file_smoke() {
    // CRLF line ends and no final newline: the file source must split the
    // lines as `str::lines` does for the direct count to match.
    let text: Vec<String> = (0..600)
        .map(|line| {
            format!(
                "The snapshot, line {}: cut {} and MARKER!",
                line % 97,
                line % 5
            )
        })
        .collect();
    let file = tempfile::NamedTempFile::new().expect("a temporary file");
    std::fs::write(file.path(), text.join("\r\n")).expect("writes");
    let mut options = wordcount::Options::smoke();
    options.input = Some(file.path().to_path_buf());
    // Slow enough that the crash comes after a checkpoint, so the restart
    // seeks the file source to a byte offset in the middle.
    options.common.records_per_second = 5_000;
    check(options, |options| &mut options.common, wordcount::run);
}

/// The server's connection string, or `None` (with a message) outside CI.
fn postgres_server() -> Option<String> {
    if let Some(url) = std::env::var(wordcount_postgres::URL_VAR)
        .ok()
        .filter(|url| !url.is_empty())
    {
        return Some(url);
    }
    assert!(
        std::env::var("CI").map_or(true, |value| value != "true"),
        "{} is not set, and CI must not skip the PostgreSQL example: .ci/run starts the server",
        wordcount_postgres::URL_VAR
    );
    eprintln!(
        "skipped: {} is not set; start a server with `eval \"$(.ci/postgres.sh start)\"`, \
         or run examples/wordcount_postgres.sh",
        wordcount_postgres::URL_VAR
    );
    None
}

fn check_wordcount_postgres(mode: Mode) {
    let Some(url) = postgres_server() else { return };
    let mut options = wordcount_postgres::Options::smoke();
    options.url = Some(url);
    options.mode = mode;
    // Slow enough that the crash comes after a checkpoint, so the restore
    // commits or rolls back transactions the crashed generation left.
    options.common.records_per_second = 2_000;
    // A table of its own: the database outlives a test run.
    options.table = Some(format!(
        "smoke_{}_{}",
        std::process::id(),
        if mode == Mode::ExactlyOnce {
            "updates"
        } else {
            "counts"
        }
    ));
    check(
        options,
        |options| &mut options.common,
        wordcount_postgres::run,
    );
}

#[test]
fn wordcount_postgres_exactly_once_smoke() {
    check_wordcount_postgres(Mode::ExactlyOnce);
}

#[test]
fn wordcount_postgres_idempotent_smoke() {
    check_wordcount_postgres(Mode::Idempotent);
}

#[test]
fn bank_smoke() {
    check(
        bank::Options::smoke(),
        |options| &mut options.common,
        bank::run,
    );
}

#[test]
fn bank_unaligned_smoke() {
    let options = bank::Options {
        unaligned: true,
        ..bank::Options::smoke()
    };
    check(options, |options| &mut options.common, bank::run);
}

/// Concurrent snapshots started by the accounts and the caller, beside the
/// checkpoints, each holding the initial total; at parallelism 1, 2 and 3.
fn check_bank_snapshots(parallelism: usize) {
    let mut options = bank_snapshots::Options::smoke();
    options.common.parallelism = parallelism;
    check(options, |options| &mut options.common, bank_snapshots::run);
}

#[test]
fn bank_snapshots_smoke_parallelism_1() {
    check_bank_snapshots(1);
}

#[test]
fn bank_snapshots_smoke_parallelism_2() {
    check_bank_snapshots(2);
}

#[test]
fn bank_snapshots_smoke_parallelism_3() {
    check_bank_snapshots(3);
}

#[test]
fn dedup_smoke() {
    check(
        dedup::Options::smoke(),
        |options| &mut options.common,
        dedup::run,
    );
}

#[test]
fn online_model_smoke() {
    check(
        online_model::Options::smoke(),
        |options| &mut options.common,
        online_model::run,
    );
}

#[test]
fn smoke_flag_selects_the_smoke_options() {
    let parsed = wordcount::Options::parse(vec!["--smoke".into()]).expect("valid");
    assert_eq!(parsed, wordcount::Options::smoke());
}

#[test]
fn bad_options_are_usage_errors() {
    let error = dedup::Options::parse(vec!["--parallelism".into(), "0".into()])
        .expect_err("parallelism 0 is rejected");
    assert!(matches!(error, ExampleError::Usage(_)));
    assert!(!error.is_retryable());
    let error = online_model::Options::parse(vec!["--bogus".into()]).expect_err("unknown flag");
    assert!(matches!(error, ExampleError::Usage(_)));
}

/// Parses `arguments` as `O`'s command line and checks that clap stops
/// with exit code `code` (the one `main_with` exits with) and a message
/// holding each of `words`.
fn check_command_line<O: ExampleOptions>(arguments: &[&str], code: i32, words: &[&str]) {
    let owned = arguments.iter().map(|word| word.to_string()).collect();
    let Err(error) = O::try_parse(owned) else {
        panic!("clap accepted {arguments:?}");
    };
    assert_eq!(error.exit_code(), code, "{error}");
    let message = error.to_string();
    for word in words {
        assert!(message.contains(word), "{word}: {message}");
    }
}

#[test]
fn help_describes_every_flag_and_a_bad_flag_exits_2() {
    check_command_line::<wordcount::Options>(
        &["--help"],
        0,
        &[
            "--words <N>",
            "--input <PATH>",
            "--crash-every <N>",
            "--smoke",
            "--http <ADDR>",
        ],
    );
    check_command_line::<wordcount_postgres::Options>(
        &["--smoke", "--help"],
        0,
        &[
            "--url <CONNECTION_STRING>",
            "--idempotent",
            "--table <NAME>",
        ],
    );
    check_command_line::<online_model::Options>(
        &["--bogus"],
        2,
        &["unexpected argument '--bogus'"],
    );
    check_command_line::<bank::Options>(&["--accounts", "0"], 2, &["must be at least 1"]);
    check_command_line::<wordcount_postgres::Options>(
        &["--table", "Bad Name"],
        2,
        &["lowercase ASCII letters"],
    );
}

#[test]
fn flags_override_the_defaults_and_the_last_crash_flag_wins() {
    let arguments = [
        "--smoke",
        "--words",
        "10",
        "--crash-every",
        "3",
        "--no-crash",
        "--rate",
        "7",
    ];
    let parsed = wordcount::Options::parse(arguments.iter().map(|a| a.to_string()).collect())
        .expect("valid");
    let mut expected = wordcount::Options::smoke();
    expected.words = 10;
    expected.common.crashes = CrashSpec::None;
    expected.common.records_per_second = 7;
    assert_eq!(parsed, expected);
}

#[test]
fn a_missing_input_file_is_an_io_error() {
    let mut options = wordcount::Options::smoke();
    options.input = Some("/nonexistent/snapflow-words.txt".into());
    let error = wordcount::run(&options).expect_err("the file does not exist");
    assert!(matches!(error, ExampleError::Io { .. }));
    assert!(!error.is_retryable());
}

#[test]
fn clickstream_smoke() {
    for parallelism in 1..=3 {
        let mut options = clickstream::Options::smoke();
        options.common.parallelism = parallelism;
        check(options, |options| &mut options.common, clickstream::run);
    }
}

/// The Kafka word count against the broker `.ci/run` starts
/// (`SNAPFLOW_KAFKA_BROKERS`, with `SNAPFLOW_TANSU_BIN` to create its
/// topics), on topics of its own; without it the test says how to start
/// one and passes, except in CI, where it fails.
#[cfg(feature = "kafka")]
#[test]
fn kafka_wordcount_smoke() {
    use snapflow_examples::kafka_wordcount::{run, Options, TEXT};
    let brokers = std::env::var("SNAPFLOW_KAFKA_BROKERS")
        .ok()
        .filter(|b| !b.is_empty());
    let tansu = std::env::var("SNAPFLOW_TANSU_BIN")
        .ok()
        .filter(|b| !b.is_empty());
    let (Some(brokers), Some(tansu)) = (brokers, tansu) else {
        assert!(
            std::env::var("CI").map_or(true, |value| value != "true"),
            "SNAPFLOW_KAFKA_BROKERS and SNAPFLOW_TANSU_BIN are not set, and CI must not skip \
             the Kafka example: .ci/run starts the broker"
        );
        eprintln!(
            "skipped: SNAPFLOW_KAFKA_BROKERS is not set; start a broker with \
             `eval \"$(.ci/kafka.sh start)\"`, or run examples/kafka_wordcount/run.sh"
        );
        return;
    };
    let suffix = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos())
    );
    let options = Options {
        lines_topic: format!("smoke-lines-{suffix}"),
        counts_topic: format!("smoke-counts-{suffix}"),
        job: format!("smoke-kafka-wordcount-{suffix}"),
        brokers,
        ..Options::from_env()
    };
    for topic in [&options.lines_topic, &options.counts_topic] {
        let status = std::process::Command::new(&tansu)
            .args(["topic", "create", "--broker"])
            .arg(format!("tcp://{}", options.brokers))
            .args(["--partitions", "2"])
            .arg(topic)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("the broker's command line runs");
        assert!(status.success(), "creating the topic {topic} failed");
    }
    let summary = run(&options).unwrap_or_else(|error| panic!("the example failed: {error}"));
    let words = TEXT.iter().flat_map(|line| line.split_whitespace()).count() as u64;
    assert_eq!(summary.counts.values().sum::<u64>(), words);
    assert!(summary.transactions > 0, "it committed no transaction");
}
