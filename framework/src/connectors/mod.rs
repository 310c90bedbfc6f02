//! Connectors to external systems, each behind a cargo feature of its own
//! so that a user who does not enable it builds none of its dependencies.
//!
//! This module owns the code that talks to servers outside the process
//! (today: PostgreSQL, feature `postgres`; Kafka, feature `kafka`). It
//! never decides when a checkpoint happens and never drives actors: a
//! connector implements the [`Sink`](crate::sink::Sink) (or source)
//! contract and the job calls it.
//!
//! Without any connector feature this module holds only what reading a
//! stored checkpoint needs: the Kafka source's position layout
//! (`kafka_position`, with its byte reader), so that the `snapflow` tool
//! and [`crate::job::inspect`] show Kafka offsets without librdkafka.

pub(crate) mod bytes;
pub(crate) mod kafka_position;
pub(crate) mod kafka_sink_state;

#[cfg(feature = "postgres")]
pub mod postgres;

#[cfg(feature = "kafka")]
pub mod kafka;
