//! snapflow: fault-tolerant, stateful stream processing on actix actors.
//!
//! Users describe their state as plain Rust structs marked
//! `#[derive(Snapshot)]`, compose operators into a graph (cycles included),
//! and get periodic, globally consistent snapshots with exactly-once
//! recovery inside their own binary.
//!
//! # Quickstart
//!
//! A word count with per-key state, checkpoints every 10 ms into a
//! directory, and a look at the last checkpoint afterwards:
//!
//! ```
//! use snapflow::job::inspect::CheckpointView;
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//! use snapflow::storage::FsCheckpointStore;
//! use snapflow::Snapshot;
//!
//! #[derive(Snapshot, Default, Clone, Debug)]
//! struct WordCount {
//!     count: u64,
//! }
//!
//! let dir = tempfile::tempdir()?;
//! let config = JobConfig {
//!     checkpoint_interval_ms: Some(10),
//!     default_parallelism: 2,
//!     ..JobConfig::default()
//! };
//! let config = config.with_store_dir(dir.path(), "quickstart")?;
//! let text = vec!["the cut", "the snapshot and the cut"];
//! let job = Job::new("quickstart", config);
//! let output = CollectHandle::new();
//! job.source("lines", VecSourceFactory::new(text.iter().map(|line| line.to_string()).collect()))
//!     .flat_map("split", |line: String| line.split(' ').map(str::to_owned).collect::<Vec<_>>())
//!     .key_by(|word: &String| word.clone())
//!     .process("count", |word: &String, state: &mut WordCount, _word: String, out| {
//!         state.count += 1; // Restored from the last checkpoint after a crash.
//!         out.emit((word.clone(), state.count));
//!         Ok(())
//!     })
//!     .sink("counts", output.clone());
//! let report = job.run()?;
//!
//! // Committed output: every update exactly once, even across restarts.
//! let mut counts = output.committed();
//! counts.sort();
//! assert_eq!(counts.len(), 7); // One update per word of the text.
//! assert!(counts.contains(&("the".to_string(), 3)));
//! assert_eq!(report.guarantee, snapflow::source::Guarantee::ExactlyOnce);
//!
//! // The final checkpoint holds each word's state.
//! let store = FsCheckpointStore::open(dir.path(), "quickstart")?;
//! let state = CheckpointView::latest(&store)?.keyed_state::<String, WordCount>("count")?;
//! assert_eq!(state["cut"].count, 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Event time
//!
//! Per user, count events in 60 s windows of event time, tolerating 5 s
//! of disorder; what comes later than that is dropped and counted:
//!
//! ```
//! use snapflow::job::{Job, JobConfig};
//! use snapflow::sink::CollectHandle;
//! use snapflow::source::VecSourceFactory;
//! use snapflow::time::{WatermarkStrategy, Windows};
//!
//! // (user, event time in ms), a little out of order.
//! let events = vec![(1u32, 1_000u64), (1, 59_000), (2, 3_000), (1, 58_000), (1, 70_000), (2, 130_000)];
//! let job = Job::new("per-user", JobConfig::default());
//! let output = CollectHandle::new();
//! let (counts, late) = job
//!     .source("events", VecSourceFactory::new(events))
//!     .assign_timestamps(WatermarkStrategy::bounded_out_of_orderness(5_000, |e: &(u32, u64)| e.1))
//!     .key_by(|e: &(u32, u64)| e.0)
//!     .window(Windows::tumbling(60_000)?, |e: &(u32, u64)| e.1)
//!     .count("count");
//! counts.sink("counts", output.clone());
//! job.run()?;
//! let mut counts: Vec<_> = output.committed().into_iter().map(|w| (w.key, w.end_ms, w.result)).collect();
//! counts.sort();
//! assert_eq!(counts, [(1, 60_000, 3), (1, 120_000, 1), (2, 60_000, 1), (2, 180_000, 1)]);
//! // An event older than the watermark's 5 s allowance, arriving after its
//! // window fired, would be dropped and counted here.
//! assert_eq!(late.dropped(), 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Modules
//!
//! Start with [`job`]: the builder ([`job::Job`], [`job::Stream`],
//! [`job::KeyedStream`]), its configuration and report, and
//! [`job::inspect`] to read a checkpoint back. Sources and sinks come
//! from [`source`] and [`sink`].
//!
//! The crate is layered; each layer knows nothing about the layers above it:
//!
//! - [`state`]: the [`Snapshot`] trait, schema descriptors and the byte format
//!   of one state blob. It never does I/O and knows nothing of actors.
//! - [`storage`]: the [`storage::CheckpointStore`]: durable parts, atomic
//!   commit of a checkpoint, listing, retention and savepoints. It moves
//!   opaque bytes and never knows what is inside a part.
//! - [`protocol`]: the pure checkpoint state machines (per node, coordinator),
//!   graph analysis and the consistency oracle. No I/O, clocks or actors.
//! - [`restart`]: restart strategies (none, fixed delay, exponential
//!   backoff, failure rate) and the pure tracker the supervisor asks after
//!   each failure. No clocks, threads or actors: time is an input.
//! - [`runtime`]: actix arbiters, actors and channels (batching, credits,
//!   fairness, panic reports). It never decides protocol questions.
//! - [`keyed`]: key groups and the keyed state backend (per-key state,
//!   snapshot per key group, restore at another parallelism).
//! - [`source`]: replayable sources (positions, splits per subtask, a Vec,
//!   an iterator, a generator, lines of a file). No actors.
//! - [`sink`]: two-phase-commit sinks (collect, print, an exactly-once file
//!   sink) and the contract a runtime drives them by. No actors.
//! - `watermark` (crate-private, re-exported by [`time`]): the clock, the
//!   watermark strategies, per-split source watermarks and the merging of
//!   an operator's input watermarks. Pure bookkeeping, below `job`.
//! - [`job`]: the user's API on top of all of these, the operator shells
//!   and the supervisor actor that checkpoints and restarts a running job.
//! - [`time`]: windows, timers and state time-to-live, built on `job`'s
//!   streams and keyed core; `job` never imports them.
//!
//! This crate never spawns a process, and talks to a network only through
//! the connectors a cargo feature turns on (`postgres`: the PostgreSQL
//! sink; `kafka`: the Kafka source and sink; both in [`connectors`]).

pub mod connectors;
#[cfg(feature = "http")]
pub mod http;
pub mod job;
pub mod keyed;
pub mod metrics;
pub mod protocol;
pub mod restart;
pub mod runtime;
pub mod sink;
pub mod source;
pub mod state;
pub mod storage;
pub mod time;
mod watermark;

pub use snapflow_macros::Snapshot;
pub use state::Snapshot;

#[doc(hidden)]
pub mod __private;
