//! wordcount_postgres: the word count of [`crate::wordcount`] writing its
//! counts into a PostgreSQL table through snapflow's PostgreSQL sink, with
//! checkpoints in a local directory and injected crashes, then checking
//! the table against a direct count.
//!
//! Two modes, each with its own table:
//!
//! - exactly-once (the default): every `(word, count)` update is a row of
//!   `wordcount_updates`, inserted with the multi-row insert inside one
//!   prepared transaction per subtask and checkpoint (`PREPARE
//!   TRANSACTION` / `COMMIT PREPARED`; the server needs
//!   `max_prepared_transactions > 0`). The check: each word's rows are
//!   exactly `1..=count`, so no update was lost or committed twice across
//!   the crashes.
//! - idempotent (`--idempotent`): `wordcount_counts (word primary key,
//!   count)` is upserted per row, keeping the larger count, so a replay
//!   after a crash changes nothing. The check: the table equals the direct
//!   count. (Per row, because a batch of running counts holds one word
//!   many times, which a multi-row upsert cannot take.)
//!
//! Both also check that the job's keyed state equals the direct count and
//! that no prepared transaction of the job is left. The server comes from
//! `--url` or `SNAPFLOW_POSTGRES_URL`; `examples/wordcount_postgres.sh`
//! starts a throw-away one and runs this example against it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls};
use snapflow::connectors::postgres::{
    Mode, MultiRowInsert, Params, PostgresConfig, PostgresError, PostgresSinkFactory,
};
use snapflow::job::Job;

use crate::common::{
    check_crashes, fresh_store, positive, print_report, CommonArgs, CommonOptions, CrashPlan,
    ExampleError, ExampleOptions, PacedSource,
};
use crate::wordcount::{
    check_counts, check_updates, declare, direct_count, generated_text, numbered_lines, print_top,
};

/// The variable that names the server when `--url` is not given.
pub const URL_VAR: &str = "SNAPFLOW_POSTGRES_URL";

/// The options of the wordcount_postgres example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Words of generated text.
    pub words: u64,
    /// The server's connection string; `None` reads [`URL_VAR`].
    pub url: Option<String>,
    /// Exactly-once (inserts of every update) or idempotent (upserts).
    pub mode: Mode,
    /// The table to (re)create and fill; `None` for the mode's default,
    /// `wordcount_updates` or `wordcount_counts`.
    pub table: Option<String>,
    /// Parallelism, crashes, checkpoints and pace.
    pub common: CommonOptions,
}

impl Options {
    /// The table this run fills.
    pub fn table(&self) -> String {
        self.table.clone().unwrap_or_else(|| match self.mode {
            Mode::ExactlyOnce => "wordcount_updates".to_owned(),
            _ => "wordcount_counts".to_owned(),
        })
    }
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            words: 100_000,
            url: None,
            mode: Mode::ExactlyOnce,
            table: None,
            // Slower than the other examples' default: the sinks first
            // connect and check the server, and at the usual pace the
            // planned crashes came before the first checkpoint, so the
            // restarts restored nothing.
            common: CommonOptions {
                records_per_second: 5_000,
                ..CommonOptions::full()
            },
        }
    }

    fn smoke() -> Self {
        Options {
            words: 3_000,
            url: None,
            mode: Mode::ExactlyOnce,
            table: None,
            common: CommonOptions::smoke(),
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            words: args.words.unwrap_or(defaults.words),
            url: args.url,
            mode: match args.idempotent {
                true => Mode::Idempotent,
                false => defaults.mode,
            },
            table: args.table,
            common: args.common.apply(defaults.common),
        }
    }
}

/// wordcount_postgres: the word count writing into a PostgreSQL table
/// through the exactly-once sink (or idempotent upserts), with injected
/// crashes, checked against a direct count (exit code 1 on a mismatch).
/// Needs a server: examples/wordcount_postgres.sh starts a throw-away one.
#[derive(Debug, clap::Parser)]
#[command(name = "wordcount_postgres", args_override_self = true)]
pub struct Args {
    /// Words of generated text [default: 100000, 3000 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    words: Option<u64>,
    /// The server's connection string [default: $SNAPFLOW_POSTGRES_URL].
    #[arg(long, value_name = "CONNECTION_STRING")]
    url: Option<String>,
    /// Upsert the counts (idempotent) instead of inserting every update
    /// in prepared transactions (exactly once).
    #[arg(long)]
    idempotent: bool,
    /// The table to (re)create and fill: 1 to 63 lowercase ASCII letters,
    /// digits and `_` [default: wordcount_updates, or wordcount_counts
    /// with --idempotent].
    #[arg(long, value_name = "NAME", value_parser = table_name)]
    table: Option<String>,
    #[command(flatten)]
    common: CommonArgs,
}

/// `--table`: a plain name, so it needs no quoting in SQL.
fn table_name(table: &str) -> Result<String, String> {
    let plain = !table.is_empty()
        && table.len() <= 63
        && table
            .bytes()
            .all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'_');
    match plain {
        true => Ok(table.to_owned()),
        false => Err("use 1 to 63 lowercase ASCII letters, digits and `_`".to_owned()),
    }
}

/// The parameters of a `(word, count)` update.
fn word_count((word, count): &(String, u64)) -> Params {
    vec![Box::new(word.clone()), Box::new(*count as i64)]
}

type WordCountParams = fn(&(String, u64)) -> Params;

/// A client error as the example's error. An error without a SQLSTATE
/// comes from the connection (refused, lost), which a retry may get past;
/// the server's own refusals do not heal.
fn database(what: &'static str) -> impl FnOnce(postgres::Error) -> ExampleError {
    move |error| ExampleError::Database {
        retryable: error.code().is_none(),
        message: format!("{what}: {error}"),
    }
}

fn sink_error(error: PostgresError) -> ExampleError {
    ExampleError::Database {
        retryable: error.is_retryable(),
        message: error.to_string(),
    }
}

/// A sink job name no earlier run used: every run starts from a fresh
/// checkpoint store, so to the sink it is a new job, and the bookkeeping
/// rows of an earlier run under the same name would read as output
/// committed after "no checkpoint" (the job would refuse to start).
fn run_name() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    format!("wordcount_{}_{nanos}", std::process::id())
}

/// Runs the example; `Ok` only when the table and the state match the
/// direct count.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let url = options
        .url
        .clone()
        .or_else(|| std::env::var(URL_VAR).ok().filter(|url| !url.is_empty()))
        .ok_or_else(|| {
            ExampleError::Usage(format!(
                "no PostgreSQL server: pass --url or set {URL_VAR} \
                 (examples/wordcount_postgres.sh starts a throw-away one)"
            ))
        })?;
    let table = options.table();
    let lines = generated_text(options.words);
    let expected = direct_count(&lines);
    let common = &options.common;
    let crash_lines = common.crashes.records(lines.len() as u64);
    let crashes = CrashPlan::new(crash_lines.clone());
    let store = fresh_store(&common.checkpoint_root, "wordcount_postgres")?;

    let mut client = Client::connect(&url, NoTls).map_err(database("connecting"))?;
    let key = if options.mode == Mode::ExactlyOnce {
        ""
    } else {
        " PRIMARY KEY"
    };
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {table}; \
             CREATE TABLE {table} (word text NOT NULL{key}, count bigint NOT NULL)"
        ))
        .map_err(database("creating the table"))?;
    let name = run_name();
    let config = PostgresConfig::new(&url, options.mode, &name, "updates");
    let sink = match options.mode {
        Mode::ExactlyOnce => PostgresSinkFactory::multi_row(
            config,
            MultiRowInsert::new(&format!("{table} (word, count)"), 2),
            word_count as WordCountParams,
        ),
        _ => PostgresSinkFactory::new(
            config,
            &format!(
                "INSERT INTO {table} (word, count) VALUES ($1, $2) ON CONFLICT (word) \
                 DO UPDATE SET count = GREATEST({table}.count, EXCLUDED.count)"
            ),
            word_count as WordCountParams,
        ),
    }
    .map_err(sink_error)?;
    println!(
        "wordcount_postgres: {} lines, {} words, {:?} into table {table}, parallelism {}, \
         checkpoint every {} ms into {}",
        lines.len(),
        options.words,
        options.mode,
        common.parallelism,
        common.checkpoint_interval_ms,
        store.job_dir().display()
    );
    println!("  crashes planned in `count` at lines {crash_lines:?}");

    let job = Job::new(
        "wordcount_postgres",
        common.job_config(Arc::new(store), crashes.planned()),
    );
    let source = PacedSource::new(numbered_lines(&lines), common.pacing());
    let state = declare(&job, source, &crashes, sink);
    let started = Instant::now();
    let report = common.run(job)?;
    let elapsed_ms = started.elapsed().as_millis();
    print_report(&report);

    let counts: BTreeMap<String, u64> = state
        .snapshot()
        .into_iter()
        .map(|(word, state)| (word, state.count))
        .collect();
    let rows: Vec<(String, u64)> = client
        .query(&format!("SELECT word, count FROM {table}"), &[])
        .map_err(database("reading the table"))?
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1) as u64))
        .collect();
    let prepared: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE $1",
            &[&format!("snapflow:{name}:%")],
        )
        .map_err(database("reading pg_prepared_xacts"))?
        .get(0);
    let mut table_counts: BTreeMap<String, u64> = BTreeMap::new();
    for (word, count) in &rows {
        let entry = table_counts.entry(word.clone()).or_default();
        *entry = (*entry).max(*count);
    }
    print_top(&table_counts);
    println!(
        "done in {elapsed_ms} ms: {} distinct words, {} rows in {table}",
        table_counts.len(),
        rows.len()
    );
    check_crashes(&crashes, &report)?;
    check_counts(&counts, &expected)?;
    if options.mode == Mode::ExactlyOnce {
        check_updates(&rows, &expected)?;
    } else {
        check_counts(&table_counts, &expected)?;
    }
    if prepared != 0 {
        return Err(ExampleError::Mismatch(format!(
            "{prepared} prepared transactions of the job are left on the server"
        )));
    }
    println!(
        "check: OK, table {table} equals a direct computation ({}) despite {} crashes, and no \
         prepared transaction is left",
        match options.mode {
            Mode::ExactlyOnce => "every update exactly once",
            _ => "every word's final count",
        },
        report.restarts.len()
    );
    Ok(())
}
