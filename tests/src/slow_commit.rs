//! A sink wrapper for the process-crash tests: it slows every commit
//! down (and, for the metrics tests, every write), and can hold the first commit of a checkpoint it staged output
//! for, so that a parent process can kill the job exactly between the
//! checkpoint becoming durable and its output becoming visible.
//!
//! It owns only the timing of `commit` and `write_batch`; every call goes to the wrapped
//! sink unchanged. It never decides anything about the output.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use snapflow::sink::{Guarantee, Sink, SinkContext, SinkError, SinkFactory, SinkState, Visibility};

/// How long a held commit waits before it goes on: long enough for any
/// parent to kill the process, short enough that a parent that never
/// kills does not hang its test for long.
pub const HOLD_MS: u64 = 60_000;

/// The line a held commit prints on stdout before it waits, followed by
/// `<checkpoint id> of subtask <subtask>`.
pub const HOLDING: &str = "holding commit";

/// Wraps `F`'s sinks: each commit first waits `commit_delay_ms`; with
/// `hold_first` the first commit (across every subtask) of a checkpoint
/// for which the sink had written records prints
/// `holding commit <id> of subtask <subtask>`
/// and waits [`HOLD_MS`].
pub struct SlowCommits<F> {
    inner: F,
    commit_delay_ms: u64,
    write_delay_ms: u64,
    hold: Option<Arc<AtomicBool>>,
}

impl<F> SlowCommits<F> {
    /// The same wrapper, also sleeping `write_delay_ms` before each batch
    /// it writes (a slow sink, which backpressures its upstream).
    pub fn with_write_delay_ms(self, write_delay_ms: u64) -> SlowCommits<F> {
        SlowCommits {
            write_delay_ms,
            ..self
        }
    }

    /// `inner`'s sinks with commits delayed by `commit_delay_ms`; with
    /// `hold_first`, the first staged commit is held as described above.
    pub fn new(inner: F, commit_delay_ms: u64, hold_first: bool) -> SlowCommits<F> {
        SlowCommits {
            inner,
            commit_delay_ms,
            write_delay_ms: 0,
            hold: hold_first.then(|| Arc::new(AtomicBool::new(true))),
        }
    }
}

impl<F: SinkFactory> SinkFactory for SlowCommits<F> {
    type Sink = SlowCommit<F::Sink>;

    fn open(&mut self, context: &SinkContext) -> Result<(), SinkError> {
        self.inner.open(context)
    }

    fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError> {
        Ok(SlowCommit {
            inner: self.inner.create(subtask, parallelism)?,
            commit_delay_ms: self.commit_delay_ms,
            write_delay_ms: self.write_delay_ms,
            hold: self.hold.clone(),
            subtask,
            wrote: false,
            staged: None,
        })
    }
}

/// One subtask's sink of [`SlowCommits`].
pub struct SlowCommit<S> {
    inner: S,
    commit_delay_ms: u64,
    write_delay_ms: u64,
    /// Armed while it holds `true`; the first holder swaps it off.
    hold: Option<Arc<AtomicBool>>,
    subtask: usize,
    /// Records were written since the last pre-commit.
    wrote: bool,
    /// The oldest checkpoint pre-committed with records and not yet
    /// committed.
    staged: Option<u64>,
}

impl<S: Sink> Sink for SlowCommit<S> {
    type Item = S::Item;

    fn bytes_written(&self) -> Option<u64> {
        self.inner.bytes_written()
    }

    fn write_batch(&mut self, batch: &[S::Item]) -> Result<(), SinkError> {
        self.wrote |= !batch.is_empty();
        if self.write_delay_ms > 0 {
            thread::sleep(Duration::from_millis(self.write_delay_ms));
        }
        self.inner.write_batch(batch)
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
        let state = self.inner.pre_commit(checkpoint_id)?;
        if std::mem::take(&mut self.wrote) && self.staged.is_none() {
            self.staged = Some(checkpoint_id);
        }
        Ok(state)
    }

    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
        thread::sleep(Duration::from_millis(self.commit_delay_ms));
        let staged_now = self.staged.is_some_and(|staged| staged <= checkpoint_id);
        if staged_now {
            let armed = self
                .hold
                .as_ref()
                .is_some_and(|hold| hold.swap(false, Ordering::SeqCst));
            if armed {
                // The parent reads this line and kills the process.
                let mut stdout = std::io::stdout();
                let _ = writeln!(
                    stdout,
                    "{HOLDING} {checkpoint_id} of subtask {}",
                    self.subtask
                );
                let _ = stdout.flush();
                thread::sleep(Duration::from_millis(HOLD_MS));
            }
            self.staged = None;
        }
        self.inner.commit(checkpoint_id)
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        self.inner.abort()
    }

    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
        self.staged = None;
        self.wrote = false;
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

    fn guarantee(&self) -> Guarantee {
        self.inner.guarantee()
    }
}
