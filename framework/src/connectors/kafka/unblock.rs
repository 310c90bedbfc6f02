//! Ending what a dead process left open before a restore reads its
//! commit marker, so that the marker shows every commit the broker
//! decided.
//!
//! Why: tansu 0.6, the test broker, applies a committed transaction's
//! transactional offsets (the commit marker) only when every other
//! transaction with records in the same partition that started before
//! it ended has asked to end too, and then only as part of one of those
//! later `EndTxn` calls (see [`gate`](super::gate) and docs/design/kafka-connector.md,
//! "how tansu 0.6 ends transactions"). A process killed between two subtasks' commits leaves one
//! subtask's commit decided but its marker not applied, behind the other
//! subtask's transaction, which nobody will end. A restore that read the
//! marker then would write that interval again. So, at a restore in a
//! new process:
//!
//! 1. every sink subtask's check ([`end_dead`]), all before any restore
//!    runs, fences the transactions its state names that no producer of
//!    this process holds (its pending ones and the ids it may have
//!    opened after the restored checkpoint): the broker aborts each
//!    still open, which is right, since none of them is committed;
//! 2. before the first marker read of the recovery, one restore ends one
//!    more transaction, with one record in every partition of the
//!    topic, by aborting it ([`nudge`], once per recovery through the
//!    factory's [`SendGate`](super::gate::SendGate); the other restores
//!    wait for it): its end applies every decided commit before it in
//!    those partitions, now that none is open. Its records are aborted
//!    (a `read_committed` reader of Kafka never sees them; tansu shows
//!    them, under a header no commit log lists).
//!
//! The ids the checks fenced are noted ([`registry::note_fenced`]), so
//! that the restore does not fence them a second time.
//!
//! On Kafka, whose `EndTxn` applies the offsets by itself, both steps
//! cost round trips and change nothing. This module never decides what
//! is committed ([`recover`](super::recover) does).

use std::time::Duration;

use rdkafka::producer::Producer;

use super::error::KafkaError;
use super::registry;
use super::sink::{KafkaOut, KafkaSinkConfig};
use super::sink_state::TxnState;
use super::txn::{self, open_txn, send};

/// Fences every id `state` names that no producer of this process holds:
/// its pending transactions and the next `fence_ahead + 1` names after
/// its `opened_after`. `prefix` is the subtask's `<prefix>-<subtask>-`.
///
/// # Errors
///
/// [`KafkaError::Client`] when a fence fails (retryable when the broker
/// is away).
pub(crate) fn end_dead(
    config: &KafkaSinkConfig,
    prefix: &str,
    state: &TxnState,
) -> Result<(), KafkaError> {
    if registry::is_live(prefix) {
        // The subtask runs in this process (in a region that is not being
        // restored): its transactions are its own.
        return Ok(());
    }
    // An opening ahead of a failed incarnation of this process must not
    // initialise an id after the fence did.
    txn::settle_ahead(prefix);
    let pending = state.pending.values().map(|pending| pending.id.clone());
    let open = (0..=config.fence_ahead)
        .map(|ahead| format!("{prefix}{}", state.opened_after.saturating_add(ahead)));
    let mut ids: Vec<String> = pending
        .chain(open)
        .filter(|id| !registry::holds(id))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    txn::fence_all(config, &ids)?;
    registry::note_fenced(&ids);
    Ok(())
}

/// Opens a transaction under `<prefix>nudge`, writes one empty record to
/// every partition of the sink's topic and aborts it (see the module
/// documentation).
///
/// # Errors
///
/// [`KafkaError::Client`] when the broker refuses or times out.
pub(crate) fn nudge(config: &KafkaSinkConfig, prefix: &str) -> Result<(), KafkaError> {
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let txn = open_txn(config, format!("{prefix}nudge"))?;
    let metadata = txn
        .producer
        .client()
        .fetch_metadata(Some(&config.topic), timeout)
        .map_err(|source| KafkaError::client("the topic's partitions (nudge)", source))?;
    let partitions = metadata
        .topics()
        .iter()
        .find(|topic| topic.name() == config.topic)
        .map_or(0, |topic| topic.partitions().len());
    for partition in 0..partitions {
        let out = KafkaOut {
            key: None,
            value: Vec::new(),
            partition: i32::try_from(partition).ok(),
            timestamp_ms: None,
        };
        send(
            &txn.producer,
            &config.topic,
            &out,
            Some(&txn.header),
            timeout,
        )?;
    }
    txn::abort_flushed(&txn.producer, timeout)
}
