//! What the PostgreSQL sink's tests share: finding the server (skip
//! outside CI, fail in CI), unique names, a plain client to read what the
//! sink wrote, and a sink wrapper that injects failures at chosen calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use postgres::{Client, NoTls};
use snapflow::connectors::postgres::{Mode, PostgresSinkFactory};
use snapflow::sink::{Sink, SinkContext, SinkError, SinkFactory, SinkState, Visibility};
pub use snapflow_tests::postgres::KeyCount;
use snapflow_tests::servers::{server_from_env, unique_name};

/// The variable that names the main server (prepared transactions on).
pub const URL_VAR: &str = "SNAPFLOW_POSTGRES_URL";
/// The variable that names the server the restart test restarts.
pub const SPARE_VAR: &str = "SNAPFLOW_POSTGRES_SPARE_URL";
/// The variable that names the server with prepared transactions off.
pub const NO_PREPARED_VAR: &str = "SNAPFLOW_POSTGRES_NO_PREPARED_URL";

/// The connection string in `var`; see
/// [`snapflow_tests::servers::server_from_env`].
pub fn server(var: &str) -> Option<String> {
    server_from_env(var, "PostgreSQL", ".ci/postgres.sh")
}

/// A table or job name no other test or run uses.
pub fn unique(what: &str) -> String {
    unique_name(what, '_')
}

/// A plain client for the test thread (no runtime runs there).
pub fn client(url: &str) -> Client {
    Client::connect(url, NoTls).expect("the test's own connection")
}

/// Creates `table (key bigint, count bigint)`, with a primary key on
/// `key` for upserts.
pub fn create_table(url: &str, table: &str, keyed: bool) {
    let key = if keyed { " PRIMARY KEY" } else { "" };
    client(url)
        .batch_execute(&format!(
            "CREATE TABLE {table} (key bigint NOT NULL{key}, count bigint NOT NULL)"
        ))
        .expect("the table is created");
}

/// Every row of `table`, sorted.
pub fn rows(url: &str, table: &str) -> Vec<(u64, u64)> {
    let mut rows: Vec<(u64, u64)> = client(url)
        .query(&format!("SELECT key, count FROM {table}"), &[])
        .expect("the table reads")
        .iter()
        .map(|row| (row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64))
        .collect();
    rows.sort_unstable();
    rows
}

/// The prepared transactions left by `job`.
pub fn prepared_of(url: &str, job: &str) -> Vec<String> {
    client(url)
        .query(
            "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE $1 ORDER BY gid",
            &[&format!("snapflow:{job}:%")],
        )
        .expect("pg_prepared_xacts reads")
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// The tests' sink factory (see [`snapflow_tests::postgres::factory`]),
/// whose start checks must pass.
pub fn factory(
    url: &str,
    mode: Mode,
    job: &str,
    table: &str,
) -> PostgresSinkFactory<(u64, u64), KeyCount> {
    snapflow_tests::postgres::factory(url, mode, job, table).expect("the sink's start checks pass")
}

/// Where a [`Chaos`] sink fails, each at most once across every subtask
/// and generation.
#[derive(Debug, Default)]
pub struct ChaosPlan {
    /// The commit call (0 for the first) that fails before committing:
    /// the prepared transaction stays, and the restore must commit it.
    pub fail_commit: Option<u64>,
    /// The write call before which the sink's own server connections are
    /// terminated (`pg_terminate_backend` from another connection).
    pub terminate_at_write: Option<u64>,
    /// The connection string and application name whose backends are
    /// terminated.
    pub terminate: Option<(String, String)>,
    commits: AtomicU64,
    writes: AtomicU64,
}

impl ChaosPlan {
    /// A plan with these failures.
    pub fn new(fail_commit: Option<u64>, terminate_at_write: Option<u64>) -> ChaosPlan {
        ChaosPlan {
            fail_commit,
            terminate_at_write,
            ..ChaosPlan::default()
        }
    }
}

/// A sink factory that injects the failures of a [`ChaosPlan`].
pub struct Chaos<F> {
    /// The real sink factory.
    pub inner: F,
    /// The failures.
    pub plan: Arc<ChaosPlan>,
}

impl<F: SinkFactory> SinkFactory for Chaos<F> {
    type Sink = ChaosSink<F::Sink>;

    fn open(&mut self, context: &SinkContext) -> Result<(), SinkError> {
        self.inner.open(context)
    }

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(ChaosSink {
            inner: self.inner.create(subtask, parallelism)?,
            plan: Arc::clone(&self.plan),
        })
    }
}

/// One subtask of a [`Chaos`] sink.
pub struct ChaosSink<S> {
    inner: S,
    plan: Arc<ChaosPlan>,
}

/// Terminates every backend of `application` from a connection of its
/// own, on a thread of its own (the caller is an actor thread, where the
/// blocking client must not run).
fn terminate_backends(url: &str, application: &str) {
    let (url, application) = (url.to_string(), application.to_string());
    std::thread::spawn(move || {
        client(&url)
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&application],
            )
            .expect("the backends are terminated");
    })
    .join()
    .expect("the terminating thread ends");
}

impl<S: Sink> Sink for ChaosSink<S> {
    type Item = S::Item;

    fn write_batch(&mut self, batch: &[S::Item]) -> Result<(), SinkError> {
        let call = self.plan.writes.fetch_add(1, Ordering::SeqCst);
        if self.plan.terminate_at_write == Some(call) {
            if let Some((url, application)) = &self.plan.terminate {
                terminate_backends(url, application);
            }
        }
        self.inner.write_batch(batch)
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.inner.pre_commit(checkpoint_id)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        let call = self.plan.commits.fetch_add(1, Ordering::SeqCst);
        if self.plan.fail_commit == Some(call) {
            return Err(SinkError::Custom {
                message: format!("injected fault before committing checkpoint {checkpoint_id}"),
                retryable: true,
            });
        }
        self.inner.commit(checkpoint_id)
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.inner.abort()
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.inner.restore(state)
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        self.inner.check_restore(restored, state)
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.inner.finish()
    }
}
