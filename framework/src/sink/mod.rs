//! Two-phase-commit sinks: the [`Sink`] trait a runtime drives, the
//! [`SinkFactory`] that builds one sink per parallel subtask, the
//! [`SinkState`] bytes a sink puts into a checkpoint, and the built-in
//! sinks.
//!
//! This module owns making output visible exactly once. It never decides
//! when a checkpoint happens or completes, never spawns actors and never
//! retries on its own; the runtime calls it and handles its errors.
//!
//! # The contract (as Flink's `TwoPhaseCommitSinkFunction`)
//!
//! A sink groups its output into transactions, one per checkpoint interval.
//!
//! 1. **Restore first.** A runtime calls [`Sink::restore`] exactly once on
//!    a new sink before anything else: with `None` for a job without a
//!    completed checkpoint, else with the [`SinkState`] stored in the
//!    checkpoint being restored. The sink then *commits* every transaction
//!    listed in that state and *aborts* every other transaction of its
//!    subtask that it can find (written or pre-committed after that
//!    checkpoint, by an earlier incarnation that died).
//! 2. **Write.** [`Sink::write_batch`] adds records to the open
//!    transaction. They are not visible to readers yet.
//! 3. **Pre-commit** at checkpoint `n`, when the sink's barrier arrives:
//!    [`Sink::pre_commit`] makes the open transaction durable (it survives a
//!    crash) but still invisible, files it under `n`, opens a new one, and
//!    returns the state listing *every* pre-committed transaction not yet
//!    committed (`n` included). The runtime stores that state in checkpoint
//!    `n`.
//! 4. **Commit** when checkpoint `n` is complete (stored by the
//!    coordinator): [`Sink::commit`] makes every pending transaction with an
//!    id `<= n` visible, in ascending id order. A checkpoint that is
//!    declined or times out needs no call: its transaction stays pending and
//!    the next completed checkpoint commits it, as in Flink.
//! 5. **Abort** when the runtime gives up on this sink object but it is
//!    still alive (cancel, a failure elsewhere): [`Sink::abort`] discards the
//!    open transaction. It must *not* discard pre-committed transactions:
//!    the checkpoint that lists them may be the one restored next, and
//!    `restore` must still be able to commit them.
//! 6. **Finish** at end of input: [`Sink::finish`] says no more records
//!    come. The runtime then still takes a final checkpoint (pre-commit and
//!    commit) so the tail becomes visible exactly once.
//!
//! **Idempotence.** `commit(n)` may be called again for a transaction that
//! is already committed, and `restore` may be called with a state whose
//! transactions were already committed: a crash between "checkpoint `n`
//! complete" and the end of `commit(n)` means the next incarnation commits
//! them again from the restored state. Both calls must then succeed and
//! change nothing. A listed transaction that is neither pending nor
//! committed is lost data and a typed error
//! ([`SinkError::MissingTransaction`]), never silently skipped.
//!
//! **Before the restore** the job asks a fresh sink of each subtask
//! [`Sink::check_restore`]: whether the staged transactions the restored
//! checkpoint lists are intact, and which checkpoints after it the sink
//! already made visible. Damaged staged data makes the checkpoint invalid
//! (the job falls back to an older one); visible output after the
//! restored checkpoint would be written twice, so the job refuses to
//! start unless the user accepts duplicates.
//!
//! **Known limits.** Restoring a checkpoint older than the latest completed
//! one cannot take back output that later checkpoints already committed
//! (the check above refuses it rather than duplicate silently).
//! Restoring at a different parallelism is not supported: a transaction
//! pending for a subtask that no longer exists is never committed.
//!
//! # A user sink
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use snapflow::sink::{PendingTransactions, Sink, SinkError, SinkState};
//!
//! /// Sums numbers; a sum becomes visible only when its checkpoint commits.
//! /// `pending` and `visible` stand for an external transactional system.
//! struct SumSink {
//!     subtask: u32,
//!     open: u64,
//!     pending: BTreeMap<u64, u64>,
//!     visible: u64,
//! }
//!
//! impl Sink for SumSink {
//!     type Item = u64;
//!
//!     fn write_batch(&mut self, batch: &[u64]) -> Result<(), SinkError> {
//!         self.open += batch.iter().sum::<u64>();
//!         Ok(())
//!     }
//!
//!     fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError> {
//!         self.pending.insert(checkpoint_id, std::mem::take(&mut self.open));
//!         let ids = self.pending.keys().copied().collect();
//!         Ok(PendingTransactions { subtask: self.subtask, checkpoint_ids: ids }.encode())
//!     }
//!
//!     fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError> {
//!         // Committing an id twice finds nothing left to do: idempotent.
//!         let later = self.pending.split_off(&(checkpoint_id + 1));
//!         self.visible += self.pending.values().sum::<u64>();
//!         self.pending = later;
//!         Ok(())
//!     }
//!
//!     fn abort(&mut self) -> Result<(), SinkError> {
//!         self.open = 0;
//!         Ok(())
//!     }
//!
//!     fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError> {
//!         // This toy keeps its "external" data in memory; a real sink would
//!         // commit the listed transactions in the external system here.
//!         let listed = match state {
//!             Some(state) => PendingTransactions::decode(state)?.checkpoint_ids,
//!             None => Vec::new(),
//!         };
//!         self.pending.retain(|id, _| listed.contains(id));
//!         if let Some(last) = listed.last() {
//!             self.commit(*last)?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! let mut sink = SumSink { subtask: 0, open: 0, pending: BTreeMap::new(), visible: 0 };
//! sink.restore(None)?;
//! sink.write_batch(&[1, 2, 3])?;
//! let state = sink.pre_commit(1)?;
//! assert_eq!(sink.visible, 0);
//! sink.commit(1)?;
//! sink.commit(1)?;
//! assert_eq!(sink.visible, 6);
//! assert_eq!(PendingTransactions::decode(&state)?.checkpoint_ids, [1]);
//! # Ok::<(), SinkError>(())
//! ```

mod collect;
mod connector;
mod file;
mod print;

pub use collect::{CollectHandle, CollectSink};
pub use connector::ConnectorError;
pub use file::{committed_files, FileSink, FileSinkFactory, DEFAULT_PREFIX};
pub use print::PrintSink;

pub use crate::source::Guarantee;

use std::io;
use std::path::PathBuf;

/// The bytes a sink stores in a checkpoint: enough to find and commit the
/// transactions pre-committed but not yet committed at that checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SinkState(Vec<u8>);

impl SinkState {
    /// A state made of the given bytes (as read back from a checkpoint).
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        SinkState(bytes)
    }

    /// The state's bytes, to be written into a checkpoint.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A sink: receives batches and makes them visible through two-phase
/// commit. See the [module documentation](self) for the contract.
///
/// Calls are synchronous; a sink should not block longer than its I/O
/// takes. One call handles a whole batch, so there is no per-record
/// virtual call.
pub trait Sink {
    /// The record type.
    type Item;

    /// Adds the records to the open transaction.
    ///
    /// # Errors
    ///
    /// A [`SinkError`]; after an error the runtime treats the sink as
    /// failed (it restores a new one), because part of the batch may have
    /// been written.
    fn write_batch(&mut self, batch: &[Self::Item]) -> Result<(), SinkError>;

    /// Makes the open transaction durable under `checkpoint_id` and opens a
    /// new one; returns every pending (pre-committed, uncommitted)
    /// transaction, for the checkpoint.
    ///
    /// # Errors
    ///
    /// A [`SinkError`]; the checkpoint must then not complete.
    fn pre_commit(&mut self, checkpoint_id: u64) -> Result<SinkState, SinkError>;

    /// Makes every pending transaction with an id `<= checkpoint_id`
    /// visible. Idempotent.
    ///
    /// # Errors
    ///
    /// A [`SinkError`]; the transactions stay pending and a later commit or
    /// a restore commits them.
    fn commit(&mut self, checkpoint_id: u64) -> Result<(), SinkError>;

    /// Discards the open transaction; keeps pre-committed ones.
    ///
    /// # Errors
    ///
    /// A [`SinkError`] when cleaning up failed; a later `restore` cleans up
    /// anyway.
    fn abort(&mut self) -> Result<(), SinkError>;

    /// Commits the transactions listed in `state` and aborts every other
    /// transaction of this subtask. Called once, first.
    ///
    /// # Errors
    ///
    /// A [`SinkError`], e.g. [`SinkError::MalformedState`] for bytes this
    /// sink did not write.
    fn restore(&mut self, state: Option<&SinkState>) -> Result<(), SinkError>;

    /// Checks, before the job restores, whether this sink can take part
    /// in restoring checkpoint `restored` (`None`: the job starts from no
    /// checkpoint) with `state`, the state this sink stored in it (`None`
    /// when there is none), and says what it has already made visible
    /// after it.
    ///
    /// The job calls it on a fresh sink of every subtask, on the
    /// checkpoint writer's thread, before any actor of the job starts;
    /// that sink is then dropped, and the sink that runs is another one
    /// (so a check must not leave anything behind that `restore` relies
    /// on). It must only read: committing and aborting are `restore`'s.
    ///
    /// Two things are checked:
    ///
    /// - **Staged data.** Every transaction `state` lists must still be
    ///   pending and intact, or already committed. A transaction that is
    ///   gone or damaged (a file cut short or changed since
    ///   `pre_commit`) is [`SinkError::StagedDataDamaged`]: the job then
    ///   treats the checkpoint as invalid and falls back to an older one,
    ///   which is safe because staged output was never visible, so the
    ///   replay makes it again.
    /// - **Visibility.** The returned [`Visibility`] lists the
    ///   checkpoints after `restored` whose output this sink already made
    ///   visible. Restoring `restored` replays their input, so their
    ///   output would appear twice: the job refuses to start
    ///   ([`JobError::FallbackWouldDuplicate`](crate::job::JobError::FallbackWouldDuplicate))
    ///   unless the user accepts duplicates. The ids also keep the job
    ///   from reusing them: new checkpoints are numbered above them.
    ///
    /// The default says [`Visibility::Unknown`]: the job then refuses a
    /// fallback past a damaged checkpoint, because it cannot rule out
    /// duplicates.
    ///
    /// # Errors
    ///
    /// [`SinkError::StagedDataDamaged`] as above; any other error fails
    /// the job's start.
    fn check_restore(
        &mut self,
        restored: Option<u64>,
        state: Option<&SinkState>,
    ) -> Result<Visibility, SinkError> {
        let _ = (restored, state);
        Ok(Visibility::Unknown)
    }

    /// No more records will come. The default does nothing.
    ///
    /// # Errors
    ///
    /// A [`SinkError`] when flushing failed.
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Bytes this sink object wrote to the system outside the job since
    /// it was made, for the live metrics (Flink's `numBytesOut` of a
    /// sink): the file sink's encoded lines, the print sink's lines, the
    /// Kafka sink's keys, values and headers, the PostgreSQL sink's
    /// parameter values in PostgreSQL's binary encoding. The runtime asks once per slice of batches while
    /// metrics are on, so return a counter the sink keeps. The default
    /// (`None`) does not count.
    fn bytes_written(&self) -> Option<u64> {
        None
    }

    /// What this sink guarantees after a restore. The default is
    /// exactly-once, which is true only if the sink follows the contract.
    fn guarantee(&self) -> Guarantee {
        Guarantee::ExactlyOnce
    }
}

/// What a sink has already made visible after the checkpoint a job is
/// about to restore; the answer of [`Sink::check_restore`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Visibility {
    /// The ids of the checkpoints after the restored one whose output
    /// this sink has made visible, ascending; empty when there are none
    /// (the usual case: nothing is committed before its checkpoint is
    /// durable, so only a fallback past a damaged checkpoint finds any).
    Known(Vec<u64>),
    /// This sink cannot tell what it made visible.
    Unknown,
    /// Writing the same output again changes nothing a reader sees (for
    /// example upserts of a keyed result into a table): a replay after a
    /// fallback is harmless, so the job runs and stays exactly-once in
    /// effect.
    ReplayIsHarmless,
}

impl Visibility {
    /// The checkpoints this sink says it made visible (none for
    /// [`Visibility::Unknown`] and [`Visibility::ReplayIsHarmless`]).
    pub fn committed(&self) -> &[u64] {
        match self {
            Visibility::Known(ids) => ids,
            Visibility::Unknown | Visibility::ReplayIsHarmless => &[],
        }
    }
}

/// What a job tells a sink's factory when the sink joins it
/// ([`SinkFactory::open`]), so that a sink need not repeat the job's
/// settings in its own (and cannot disagree with them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SinkContext {
    /// The job's name.
    pub job: String,
    /// The sink operator's name.
    pub operator: String,
    /// The checkpoint interval the job runs with:
    /// [`JobConfig::checkpoint_interval_ms`](crate::job::JobConfig::checkpoint_interval_ms),
    /// or [`DEFAULT_CHECKPOINT_INTERVAL_MS`](crate::job::DEFAULT_CHECKPOINT_INTERVAL_MS)
    /// for a job with a store and no interval. `None`: no periodic
    /// checkpoints (a bounded job still takes a final one at its end, so
    /// a sink's first transaction then lasts the whole run).
    pub checkpoint_interval_ms: Option<u64>,
}

impl SinkContext {
    /// The context of sink `operator` of job `job`, checkpointing every
    /// `checkpoint_interval_ms` (for a test that drives a factory
    /// without a job).
    pub fn new(job: &str, operator: &str, checkpoint_interval_ms: Option<u64>) -> SinkContext {
        SinkContext {
            job: job.to_owned(),
            operator: operator.to_owned(),
            checkpoint_interval_ms,
        }
    }
}

/// Builds the sink of one parallel subtask.
pub trait SinkFactory {
    /// The sink each subtask gets.
    type Sink: Sink;

    /// Called once when the sink joins a job
    /// ([`Stream::sink`](crate::job::Stream::sink)), before any
    /// [`SinkFactory::create`], with what the job tells its sinks. A
    /// factory that needs the job's settings (the Kafka sink checks its
    /// transaction time-out against the checkpoint interval) keeps them
    /// here. The default does nothing.
    ///
    /// # Errors
    ///
    /// A [`SinkError`] when the sink cannot work with this job; the job
    /// then does not start
    /// ([`JobError::SinkConfig`](crate::job::JobError::SinkConfig)).
    fn open(&mut self, context: &SinkContext) -> Result<(), SinkError> {
        let _ = context;
        Ok(())
    }

    /// The sink of subtask `subtask` out of `parallelism`. It is called
    /// again with the same arguments for each new incarnation after a
    /// failure.
    ///
    /// # Errors
    ///
    /// A [`SinkError`] when the sink cannot be set up.
    fn create(&self, subtask: usize, parallelism: usize) -> Result<Self::Sink, SinkError>;
}

/// The usual content of a [`SinkState`]: the subtask and the ids of its
/// pending transactions, in ascending order.
///
/// Layout (little-endian): format byte `1`, subtask `u32`, count `u32`,
/// then `count` checkpoint ids as `u64`. Decoding checks the exact length
/// before allocating, so hostile bytes cannot make it allocate more than
/// they justify.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PendingTransactions {
    /// The subtask that wrote the state.
    pub subtask: u32,
    /// Checkpoint ids of pending transactions, ascending.
    pub checkpoint_ids: Vec<u64>,
}

const PENDING_FORMAT: u8 = 1;
const PENDING_HEADER_BYTES: usize = 9;

impl PendingTransactions {
    /// The state bytes.
    pub fn encode(&self) -> SinkState {
        let mut bytes = Vec::with_capacity(PENDING_HEADER_BYTES + 8 * self.checkpoint_ids.len());
        bytes.push(PENDING_FORMAT);
        bytes.extend_from_slice(&self.subtask.to_le_bytes());
        // A sink has far fewer than 2^32 pending transactions; saturating
        // would make the length check below fail loudly, not silently.
        let count = u32::try_from(self.checkpoint_ids.len()).unwrap_or(u32::MAX);
        bytes.extend_from_slice(&count.to_le_bytes());
        for id in &self.checkpoint_ids {
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        SinkState(bytes)
    }

    /// Reads state bytes written by [`PendingTransactions::encode`], or
    /// the file sink's state (format byte `2`, the same ids with the size
    /// and CRC-32 of each staged file), whose ids it returns.
    ///
    /// # Errors
    ///
    /// [`SinkError::MalformedState`] for any other bytes, including ids
    /// that are not strictly ascending.
    pub fn decode(state: &SinkState) -> Result<Self, SinkError> {
        let bytes = state.as_bytes();
        let malformed = |reason: &str| SinkError::MalformedState {
            reason: reason.to_string(),
        };
        if bytes.len() < PENDING_HEADER_BYTES {
            return Err(malformed("shorter than its header"));
        }
        if bytes[0] == STAGED_FORMAT {
            let staged = decode_staged(state)?;
            return Ok(PendingTransactions {
                subtask: staged.subtask,
                checkpoint_ids: staged.files.into_iter().map(|(id, _)| id).collect(),
            });
        }
        if bytes[0] != PENDING_FORMAT {
            return Err(malformed("unknown format byte"));
        }
        let subtask = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
        let count = u32::from_le_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) as usize;
        let body = &bytes[PENDING_HEADER_BYTES..];
        if body.len() / 8 != count || body.len() % 8 != 0 {
            return Err(malformed("length does not match the transaction count"));
        }
        let checkpoint_ids: Vec<u64> = body
            .chunks_exact(8)
            .map(|chunk| u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])))
            .collect();
        if checkpoint_ids.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(malformed("checkpoint ids are not strictly ascending"));
        }
        Ok(PendingTransactions {
            subtask,
            checkpoint_ids,
        })
    }

    /// Decodes `state` and checks that it belongs to `subtask`; `None`
    /// gives an empty list.
    ///
    /// # Errors
    ///
    /// [`SinkError::MalformedState`], or [`SinkError::WrongSubtask`] when
    /// the state was written by another subtask.
    pub fn decode_for(state: Option<&SinkState>, subtask: usize) -> Result<Vec<u64>, SinkError> {
        let Some(state) = state else {
            return Ok(Vec::new());
        };
        let pending = PendingTransactions::decode(state)?;
        if pending.subtask as usize != subtask {
            return Err(SinkError::WrongSubtask {
                expected: subtask,
                found: pending.subtask,
            });
        }
        Ok(pending.checkpoint_ids)
    }
}

/// Why a sink call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SinkError {
    /// A file operation failed.
    #[error("sink I/O failed while {operation} `{path}`: {source}")]
    Io {
        /// What the sink was doing, e.g. "renaming".
        operation: &'static str,
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Writing to a sink's output stream (not a file it manages) failed.
    #[error("sink output failed: {source}")]
    Output {
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A name (file prefix, subtask number) the sink cannot use.
    #[error("invalid sink name `{name}`: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// State bytes this sink did not write.
    #[error("malformed sink state: {reason}")]
    MalformedState {
        /// What is wrong with the bytes.
        reason: String,
    },
    /// A state written by another subtask.
    #[error("sink state belongs to subtask {found}, not to subtask {expected}")]
    WrongSubtask {
        /// This sink's subtask.
        expected: usize,
        /// The subtask recorded in the state.
        found: u32,
    },
    /// A transaction the state lists as pending is neither pending nor
    /// committed: its data is lost.
    #[error("transaction of checkpoint {checkpoint_id} (subtask {subtask}) is neither pending nor committed")]
    MissingTransaction {
        /// The subtask.
        subtask: usize,
        /// The transaction's checkpoint id.
        checkpoint_id: u64,
    },
    /// Data a sink staged at `pre_commit` and a checkpoint lists is gone or
    /// no longer what was staged: that checkpoint cannot be restored.
    #[error(
        "staged output of checkpoint {checkpoint_id} (subtask {subtask}) at `{location}` is damaged: {reason}"
    )]
    StagedDataDamaged {
        /// The subtask.
        subtask: usize,
        /// The transaction's checkpoint id.
        checkpoint_id: u64,
        /// Where the staged data was (a file, a transaction name).
        location: String,
        /// What is wrong: missing, a different size, a different checksum.
        reason: String,
    },
    /// Committing would overwrite output that already exists and was not
    /// written by this transaction (e.g. another job used the directory).
    #[error("committing would overwrite existing output `{path}`")]
    TargetExists {
        /// The existing file.
        path: PathBuf,
    },
    /// Another process (or another factory in this one) writes files of
    /// the same prefix into the same directory: it holds the directory's
    /// lock for that prefix. Not retryable: two writers would commit each
    /// other's output twice or cut it short.
    #[error(
        "the output directory `{dir}` is in use for prefix `{prefix}` by another process ({}); \
         stop the other one, or give this sink another directory or prefix",
        owner.as_deref().unwrap_or("owner unknown")
    )]
    DirectoryInUse {
        /// The output directory.
        dir: PathBuf,
        /// The file-name prefix the lock is for.
        prefix: String,
        /// What the owner wrote into the lock file (pid, host, since
        /// when), when it could be read.
        owner: Option<String>,
    },
    /// A call the contract does not allow at this point, e.g. a write after
    /// `finish` or a pre-commit with an id not above the last one.
    #[error("sink misuse: {reason}")]
    Misuse {
        /// What the caller did wrong.
        reason: String,
    },
    /// An error of a connector to an external system (the PostgreSQL
    /// sink's `PostgresError`), kept whole: reach it with
    /// [`ConnectorError::downcast_ref`].
    #[error(transparent)]
    Connector(ConnectorError),
    /// An error of a user-written sink.
    #[error("{message}")]
    Custom {
        /// What went wrong.
        message: String,
        /// Whether the same call may succeed later.
        retryable: bool,
    },
}

impl SinkError {
    /// Whether trying the same call again may succeed. Transient I/O
    /// errors are retryable; bad state, lost data and misuse are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            SinkError::Io { source, .. } | SinkError::Output { source } => {
                crate::source::is_transient(source)
            }
            SinkError::Custom { retryable, .. } => *retryable,
            SinkError::Connector(error) => error.is_retryable(),
            SinkError::InvalidName { .. }
            | SinkError::MalformedState { .. }
            | SinkError::WrongSubtask { .. }
            | SinkError::MissingTransaction { .. }
            | SinkError::StagedDataDamaged { .. }
            | SinkError::TargetExists { .. }
            | SinkError::DirectoryInUse { .. }
            | SinkError::Misuse { .. } => false,
        }
    }
}

/// Pre-commit ids must rise, or two transactions would share an id.
pub(crate) fn check_ascending(last: Option<u64>, checkpoint_id: u64) -> Result<(), SinkError> {
    match last {
        Some(last) if checkpoint_id <= last => Err(SinkError::Misuse {
            reason: format!("pre_commit({checkpoint_id}) after pre_commit({last}); ids must rise"),
        }),
        _ => Ok(()),
    }
}

/// The subtask as stored in [`PendingTransactions`].
pub(crate) fn subtask_u32(subtask: usize) -> Result<u32, SinkError> {
    u32::try_from(subtask).map_err(|_| SinkError::InvalidName {
        name: subtask.to_string(),
        reason: "subtask index above u32::MAX",
    })
}

/// The size and CRC-32 of a staged file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Digest {
    pub(crate) size_bytes: u64,
    pub(crate) crc32: u32,
}

/// The file sink's state: its subtask and every pending transaction with
/// the size and checksum of its staged file.
///
/// Layout (little-endian): format byte `2`, subtask `u32`, count `u32`,
/// then per transaction its checkpoint id `u64`, size `u64` and CRC-32
/// `u32`. States of format `1` ([`PendingTransactions`], written before
/// the sink recorded digests) are still read; their files are restored
/// unchecked.
pub(crate) struct StagedFiles {
    pub(crate) subtask: u32,
    pub(crate) files: Vec<(u64, Option<Digest>)>,
}

const STAGED_FORMAT: u8 = 2;
const STAGED_HEADER_BYTES: usize = 9;
const STAGED_ENTRY_BYTES: usize = 20;

pub(crate) fn encode_staged(staged: &StagedFiles) -> SinkState {
    let mut bytes =
        Vec::with_capacity(STAGED_HEADER_BYTES + STAGED_ENTRY_BYTES * staged.files.len());
    bytes.push(STAGED_FORMAT);
    bytes.extend_from_slice(&staged.subtask.to_le_bytes());
    let count = u32::try_from(staged.files.len()).unwrap_or(u32::MAX);
    bytes.extend_from_slice(&count.to_le_bytes());
    for (id, digest) in &staged.files {
        let digest = digest.unwrap_or_default();
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&digest.size_bytes.to_le_bytes());
        bytes.extend_from_slice(&digest.crc32.to_le_bytes());
    }
    SinkState::from_bytes(bytes)
}

/// Reads a state of format 2.
pub(crate) fn decode_staged(state: &SinkState) -> Result<StagedFiles, SinkError> {
    let bytes = state.as_bytes();
    let malformed = |reason: &str| SinkError::MalformedState {
        reason: reason.to_string(),
    };
    if bytes.len() < STAGED_HEADER_BYTES {
        return Err(malformed("shorter than its header"));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let (subtask, count) = (word(1), word(5) as usize);
    let body = &bytes[STAGED_HEADER_BYTES..];
    if body.len() % STAGED_ENTRY_BYTES != 0 || body.len() / STAGED_ENTRY_BYTES != count {
        return Err(malformed("length does not match the transaction count"));
    }
    let long = |chunk: &[u8], at: usize| {
        u64::from_le_bytes(chunk[at..at + 8].try_into().unwrap_or([0; 8]))
    };
    let files: Vec<(u64, Option<Digest>)> = body
        .chunks_exact(STAGED_ENTRY_BYTES)
        .map(|chunk| {
            let crc32 = u32::from_le_bytes(chunk[16..20].try_into().unwrap_or([0; 4]));
            let size_bytes = long(chunk, 8);
            (long(chunk, 0), Some(Digest { size_bytes, crc32 }))
        })
        .collect();
    if files.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
        return Err(malformed("checkpoint ids are not strictly ascending"));
    }
    Ok(StagedFiles { subtask, files })
}

/// Reads a state of format 1 or 2 of `subtask` (`None`: empty).
pub(crate) fn decode_staged_for(
    state: Option<&SinkState>,
    subtask: usize,
) -> Result<Vec<(u64, Option<Digest>)>, SinkError> {
    let Some(state) = state else {
        return Ok(Vec::new());
    };
    if state.as_bytes().first() != Some(&STAGED_FORMAT) {
        let ids = PendingTransactions::decode_for(Some(state), subtask)?;
        return Ok(ids.into_iter().map(|id| (id, None)).collect());
    }
    let staged = decode_staged(state)?;
    if staged.subtask as usize != subtask {
        return Err(SinkError::WrongSubtask {
            expected: subtask,
            found: staged.subtask,
        });
    }
    Ok(staged.files)
}
