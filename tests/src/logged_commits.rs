//! A sink wrapper for the Kafka process-crash tests: after every commit
//! and restore of the wrapped Kafka sink it appends the transactions its
//! [`CommitLog`] gained to a file, so that the parent process knows every
//! transaction any of its (killed) children committed.
//!
//! The file is written on the sink's own thread before `commit` or
//! `restore` returns, so a transaction is in the file before the sink
//! pre-commits the next checkpoint: a restore from a later checkpoint
//! never needs it again. A kill between the broker's commit and the file
//! write is what the sink's restore recovers through its commit marker
//! (the next restore lists the transaction, finds it committed and adds
//! it to the log). It owns only the file; every call goes to the wrapped
//! sink unchanged.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use snapflow::connectors::kafka::CommitLog;
use snapflow::sink::{Guarantee, Sink, SinkContext, SinkError, SinkFactory, SinkState, Visibility};

/// Wraps `F`'s sinks; see the module documentation.
pub struct LoggedCommits<F> {
    inner: F,
    shared: Arc<Shared>,
}

struct Shared {
    log: CommitLog,
    path: PathBuf,
    /// How many entries of the log are in the file already.
    written: Mutex<usize>,
}

impl Shared {
    /// Appends `line` to `<path>.events`, the runs' history a failing
    /// test prints (best effort: it only explains failures).
    fn event(&self, line: &str) {
        let mut path = self.path.clone().into_os_string();
        path.push(".events");
        if let Ok(mut file) = OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(file, "pid {} {line}", std::process::id());
        }
    }

    fn write_new(&self) -> Result<(), SinkError> {
        let mut written = self
            .written
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let committed = self.log.committed();
        if committed.len() <= *written {
            return Ok(());
        }
        let mut text = String::new();
        for header in &committed[*written..] {
            text.push_str(header);
            text.push('\n');
        }
        let io = |error: std::io::Error| SinkError::Misuse {
            reason: format!("writing the commit log file: {error}"),
        };
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        *written = committed.len();
        Ok(())
    }
}

impl<F> LoggedCommits<F> {
    /// `inner`'s sinks, whose committed transactions (`log`) are appended
    /// to `path`, one header per line.
    pub fn new(inner: F, log: CommitLog, path: PathBuf) -> LoggedCommits<F> {
        LoggedCommits {
            inner,
            shared: Arc::new(Shared {
                log,
                path,
                written: Mutex::new(0),
            }),
        }
    }
}

impl<F: SinkFactory> SinkFactory for LoggedCommits<F> {
    type Sink = LoggedCommit<F::Sink>;

    fn open(&mut self, context: &SinkContext) -> Result<(), SinkError> {
        self.inner.open(context)
    }

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(LoggedCommit {
            inner: self.inner.create(subtask, parallelism)?,
            shared: Arc::clone(&self.shared),
        })
    }
}

/// One subtask's sink of [`LoggedCommits`].
pub struct LoggedCommit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Sink> Sink for LoggedCommit<S> {
    type Item = S::Item;

    fn bytes_written(&self) -> Option<u64> {
        self.inner.bytes_written()
    }

    fn write_batch(&mut self, batch: &[S::Item]) -> Result<(), SinkError> {
        self.inner.write_batch(batch)
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.shared.event(&format!("pre-commit {checkpoint_id}"));
        self.inner.pre_commit(checkpoint_id)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        let result = self.inner.commit(checkpoint_id);
        self.shared.event(&format!(
            "commit {checkpoint_id}: {:?}",
            result.as_ref().err()
        ));
        // Written even when a later pending transaction failed: what was
        // committed before it is in the log.
        self.shared.write_new()?;
        result
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.inner.abort()
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.shared.event("restoring");
        let result = self.inner.restore(state);
        self.shared.event(&format!(
            "restore from {:?} bytes: {:?}",
            state.map(|state| state.as_bytes().len()),
            result.as_ref().err()
        ));
        self.shared.write_new()?;
        result
    }

    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        self.shared
            .event(&format!("checking a restore from {restored:?}"));
        let result = self.inner.check_restore(restored, state);
        self.shared.event(&format!("checked: {result:?}"));
        result
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.inner.finish()
    }

    fn guarantee(&self) -> Guarantee {
        self.inner.guarantee()
    }
}
