//! PostgreSQL sink benchmark: rows per second into a real server through
//! `PostgresSink`, in exactly-once mode (prepared transactions) and in
//! idempotent mode (upserts), each with the per-row statement and the
//! multi-row insert, against a hand-written client that sends the same
//! rows as batched multi-row `INSERT`s (and upserts), and `COPY`, in the
//! same run and on the same table.
//!
//! Both sides commit once per `--rows-per-checkpoint` rows, the sink as
//! the runtime drives it (`write_batch` in batches of `--write-batch`
//! records, then `pre_commit` and `commit` per checkpoint), the client
//! with `BEGIN` ... `COMMIT` (so the client has no two-phase commit
//! cost: the ratio includes the sink's `PREPARE TRANSACTION` and
//! bookkeeping row). The sink's calls run on this thread, as they would
//! on an actor's; no job, source or channel is involved, so the figure
//! is the sink's own cost, not a job's. Every run checks the table's
//! row count and sum of values.
//!
//! Needs a server: `eval "$(.ci/postgres.sh start)"`, then
//! `cargo bench -p snapflow --features postgres --bench postgres_sink`
//! (`-- --help` for the options, `-- --smoke` for a tiny run). Without
//! `SNAPFLOW_POSTGRES_URL` (or `--url`) it says how to start one and
//! exits with 0. It asserts nothing about speed.

mod support;

use std::process::ExitCode;
use std::time::Instant;

use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{ToSql, Type};
use postgres::{Client, NoTls};
use snapflow::connectors::postgres::{
    Mode, MultiRowInsert, Params, PostgresConfig, PostgresSinkFactory,
};
use snapflow::sink::{Sink, SinkFactory};

use support::{bench_main, median, positive, CargoBench};

/// Rows per second into a real PostgreSQL server through the sink, in
/// exactly-once and idempotent mode, against a hand-written client
/// sending the same rows (batched inserts, upserts and `COPY`).
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "postgres_sink", args_override_self = true)]
struct Options {
    /// Rows [with --smoke: 5000].
    #[arg(long, value_name = "N", value_parser = positive::<u64>, default_value_t = 200_000)]
    rows: u64,
    /// The sink's `batch_rows` and the client's rows per statement.
    #[arg(long, value_name = "B", value_parser = positive::<usize>, default_value_t = 500)]
    batch_rows: usize,
    /// Records per `write_batch` call.
    #[arg(long, value_name = "W", value_parser = positive::<usize>, default_value_t = 256)]
    write_batch: usize,
    /// Rows between two checkpoints [with --smoke: 1000].
    #[arg(long, value_name = "C", value_parser = positive::<u64>, default_value_t = 20_000)]
    rows_per_checkpoint: u64,
    /// Runs (medians are printed) [with --smoke: 1].
    #[arg(long, value_name = "R", value_parser = positive::<usize>, default_value_t = 3)]
    runs: usize,
    /// The server's connection string [default: $SNAPFLOW_POSTGRES_URL;
    /// without one, the benchmark says how to start one and exits].
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// A tiny run: 5000 rows, a checkpoint every 1000, one run (in place
    /// of those flags).
    #[arg(long)]
    smoke: bool,
    #[command(flatten)]
    cargo: CargoBench,
}

/// Applies `--smoke` and the server from the environment.
fn settle(mut options: Options) -> Result<Options, String> {
    if options.smoke {
        options.rows = 5_000;
        options.rows_per_checkpoint = 1_000;
        options.runs = 1;
    }
    options.url = support::or_env(options.url, "SNAPFLOW_POSTGRES_URL");
    Ok(options)
}

/// The value of row `id`.
fn value_of(id: u64) -> i64 {
    (id * 7 % 1_000) as i64
}

/// What the table must hold after a run: the row count and the sum of
/// values.
fn expected(rows: u64) -> (i64, i64) {
    (rows as i64, (0..rows).map(value_of).sum())
}

/// The parameters of one record.
fn row_params(&(id, value): &(i64, i64)) -> Params {
    vec![Box::new(id), Box::new(value)]
}

type RowParams = fn(&(i64, i64)) -> Params;

/// One writer under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    ClientInsert,
    ClientUpsert,
    ClientCopy,
    Sink { mode: Mode, multi_row: bool },
}

impl Writer {
    fn name(self) -> &'static str {
        match self {
            Writer::ClientInsert => "client multi-row INSERT",
            Writer::ClientUpsert => "client multi-row upsert",
            Writer::ClientCopy => "client COPY (binary)",
            Writer::Sink {
                mode: Mode::ExactlyOnce,
                multi_row: false,
            } => "sink exactly-once, per-row INSERT",
            Writer::Sink {
                mode: Mode::ExactlyOnce,
                multi_row: true,
            } => "sink exactly-once, multi-row INSERT",
            Writer::Sink {
                multi_row: false, ..
            } => "sink idempotent, per-row upsert",
            Writer::Sink { .. } => "sink idempotent, multi-row upsert",
        }
    }
}

/// Every writer, in the order they run and print.
const WRITERS: [Writer; 7] = [
    Writer::ClientInsert,
    Writer::ClientCopy,
    Writer::Sink {
        mode: Mode::ExactlyOnce,
        multi_row: false,
    },
    Writer::Sink {
        mode: Mode::ExactlyOnce,
        multi_row: true,
    },
    Writer::ClientUpsert,
    Writer::Sink {
        mode: Mode::Idempotent,
        multi_row: false,
    },
    Writer::Sink {
        mode: Mode::Idempotent,
        multi_row: true,
    },
];

/// The upsert's conflict clause; the values are new on every run, so it
/// never updates, but PostgreSQL still checks for the conflict.
fn on_conflict(table: &str) -> String {
    format!("(id) DO UPDATE SET value = GREATEST({table}.value, EXCLUDED.value)")
}

/// The client's multi-row statement for `rows` rows.
fn client_sql(table: &str, rows: usize, upsert: bool) -> String {
    let insert = MultiRowInsert::new(&format!("{table} (id, value)"), 2);
    if upsert {
        insert.on_conflict(&on_conflict(table)).sql(rows)
    } else {
        insert.sql(rows)
    }
}

/// The hand-written client: multi-row statements of `batch_rows` rows,
/// or binary COPY, one transaction per `rows_per_checkpoint` rows.
fn run_client(
    client: &mut Client,
    table: &str,
    options: &Options,
    writer: Writer,
) -> Result<(), postgres::Error> {
    let records: Vec<(i64, i64)> = (0..options.rows)
        .map(|id| (id as i64, value_of(id)))
        .collect();
    let upsert = writer == Writer::ClientUpsert;
    let full = client.prepare(&client_sql(table, options.batch_rows, upsert))?;
    for interval in records.chunks(options.rows_per_checkpoint as usize) {
        let mut transaction = client.transaction()?;
        if writer == Writer::ClientCopy {
            let sink =
                transaction.copy_in(&format!("COPY {table} (id, value) FROM STDIN BINARY"))?;
            let mut writer = BinaryCopyInWriter::new(sink, &[Type::INT8, Type::INT8]);
            for (id, value) in interval {
                writer.write(&[id, value])?;
            }
            writer.finish()?;
        } else {
            for chunk in interval.chunks(options.batch_rows) {
                let params: Vec<&(dyn ToSql + Sync)> = chunk
                    .iter()
                    .flat_map(|(id, value)| [id as &(dyn ToSql + Sync), value])
                    .collect();
                if chunk.len() == options.batch_rows {
                    transaction.execute(&full, &params)?;
                } else {
                    transaction.execute(&client_sql(table, chunk.len(), upsert), &params)?;
                }
            }
        }
        transaction.commit()?;
    }
    Ok(())
}

/// The sink as the runtime drives it: batches of `write_batch` records,
/// a pre-commit and commit every `rows_per_checkpoint` rows, a final
/// checkpoint after `finish`.
fn run_sink(
    url: &str,
    table: &str,
    options: &Options,
    mode: Mode,
    multi_row: bool,
    job: &str,
) -> Result<(), String> {
    let mut config = PostgresConfig::new(url, mode, job, "sink");
    config.batch_rows = options.batch_rows;
    let factory = if multi_row {
        let mut insert = MultiRowInsert::new(&format!("{table} (id, value)"), 2);
        if mode == Mode::Idempotent {
            insert = insert.on_conflict(&on_conflict(table));
        }
        PostgresSinkFactory::multi_row(config, insert, row_params as RowParams)
    } else {
        let sql = client_sql(table, 1, mode == Mode::Idempotent);
        PostgresSinkFactory::new(config, &sql, row_params as RowParams)
    }
    .map_err(|error| error.to_string())?;
    let mut sink = factory.create(0, 1).map_err(|error| error.to_string())?;
    sink.restore(None).map_err(|error| error.to_string())?;
    let records: Vec<(i64, i64)> = (0..options.rows)
        .map(|id| (id as i64, value_of(id)))
        .collect();
    let mut checkpoint = 0;
    for interval in records.chunks(options.rows_per_checkpoint as usize) {
        for batch in interval.chunks(options.write_batch) {
            sink.write_batch(batch).map_err(|error| error.to_string())?;
        }
        checkpoint += 1;
        sink.pre_commit(checkpoint)
            .map_err(|error| error.to_string())?;
        sink.commit(checkpoint).map_err(|error| error.to_string())?;
    }
    sink.finish().map_err(|error| error.to_string())?;
    checkpoint += 1;
    sink.pre_commit(checkpoint)
        .map_err(|error| error.to_string())?;
    sink.commit(checkpoint).map_err(|error| error.to_string())
}

/// One writer's run on an empty table: rows per second, after checking
/// what the table holds.
fn measure(
    client: &mut Client,
    url: &str,
    table: &str,
    options: &Options,
    writer: Writer,
    run: usize,
) -> Result<f64, String> {
    client
        .batch_execute(&format!("TRUNCATE {table}"))
        .map_err(|error| error.to_string())?;
    let index = WRITERS
        .iter()
        .position(|known| *known == writer)
        .unwrap_or(0);
    let job = format!("bench_{}_{run}_{index}", std::process::id());
    let started = Instant::now();
    match writer {
        Writer::Sink { mode, multi_row } => run_sink(url, table, options, mode, multi_row, &job)?,
        client_writer => run_client(client, table, options, client_writer)
            .map_err(|error| format!("{}: {error}", writer.name()))?,
    }
    let seconds = started.elapsed().as_secs_f64();
    let row = client
        .query_one(
            &format!("SELECT count(*), coalesce(sum(value), 0)::bigint FROM {table}"),
            &[],
        )
        .map_err(|error| error.to_string())?;
    let found: (i64, i64) = (row.get(0), row.get(1));
    if found != expected(options.rows) {
        return Err(format!(
            "{}: the table holds (rows, sum) = {found:?}, expected {:?}",
            writer.name(),
            expected(options.rows)
        ));
    }
    Ok(options.rows as f64 / seconds)
}

fn run(options: &Options) -> Result<(), String> {
    let Some(url) = options.url.clone() else {
        println!(
            "postgres_sink: skipped, SNAPFLOW_POSTGRES_URL is not set; start a server with \
             `eval \"$(.ci/postgres.sh start)\"` (stop it with `.ci/postgres.sh stop`)"
        );
        return Ok(());
    };
    let mut client = Client::connect(&url, NoTls).map_err(|error| error.to_string())?;
    let table = format!("bench_rows_{}", std::process::id());
    client
        .batch_execute(&format!(
            "CREATE TABLE {table} (id bigint PRIMARY KEY, value bigint NOT NULL)"
        ))
        .map_err(|error| error.to_string())?;
    println!(
        "postgres_sink: {} rows (id bigint primary key, value bigint), {} rows per statement \
         and per sink batch, {} records per write_batch, a commit every {} rows, {} runs",
        options.rows,
        options.batch_rows,
        options.write_batch,
        options.rows_per_checkpoint,
        options.runs
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); WRITERS.len()];
    let outcome = (|| {
        for run in 0..options.runs {
            for (index, writer) in WRITERS.iter().enumerate() {
                let rate = measure(&mut client, &url, &table, options, *writer, run)?;
                println!("run {run}: {:<38} {:>10.0} rows/s", writer.name(), rate);
                rates[index].push(rate);
            }
        }
        Ok::<(), String>(())
    })();
    let _ = client.batch_execute(&format!("DROP TABLE IF EXISTS {table}"));
    outcome?;
    let medians: Vec<f64> = rates.iter_mut().map(|rates| median(rates)).collect();
    println!("medians:");
    for (writer, rate) in WRITERS.iter().zip(&medians) {
        println!("  {:<38} {:>10.0} rows/s", writer.name(), rate);
    }
    let [insert, copy, eo_row, eo_multi, upsert, idem_row, idem_multi] = medians[..] else {
        return Err("one median per writer".to_string());
    };
    println!("ratios (sink / hand-written client, target >= 0.5):");
    println!(
        "  exactly-once per-row   / multi-row INSERT: {:.2}",
        eo_row / insert
    );
    println!(
        "  exactly-once multi-row / multi-row INSERT: {:.2}",
        eo_multi / insert
    );
    println!(
        "  exactly-once multi-row / COPY:             {:.2}",
        eo_multi / copy
    );
    println!(
        "  idempotent per-row     / multi-row upsert: {:.2}",
        idem_row / upsert
    );
    println!(
        "  idempotent multi-row   / multi-row upsert: {:.2}",
        idem_multi / upsert
    );
    Ok(())
}

fn main() -> ExitCode {
    bench_main("postgres_sink", settle, run)
}
