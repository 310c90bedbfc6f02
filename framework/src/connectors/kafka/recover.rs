//! Finishing pre-committed transactions: at a checkpoint's commit, and at
//! a restore, which may run in a new process after the one that
//! pre-committed them died.
//!
//! For each pending transaction, in checkpoint order, the first of these
//! that holds decides:
//!
//! 1. this factory's [`CommitLog`] has its header, or this process
//!    committed it (through another factory's sink, [`registry`]): it is
//!    committed;
//! 2. this process still holds its producer ([`registry`]): commit it
//!    with that producer;
//! 3. the subtask's commit marker ([`marker`](super::marker)) reached its
//!    checkpoint: a process that died committed it; it is added to the
//!    log under the header that marker names;
//! 4. otherwise nobody committed it and nobody can (librdkafka cannot
//!    commit another producer object's transaction): it and every later
//!    pending transaction are written again from the sink state into one
//!    new transaction, with the marker of the last, after fencing the
//!    old ids.
//!
//! This module owns that decision and the writing again. It never
//! decides which checkpoint is restored and never reads the topics.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rdkafka::producer::Producer;

use super::error::KafkaError;
use super::gate::SendGate;
use super::marker::{Committed, Marker, MarkerGroup};
use super::registry;
use super::sink::{CommitLog, KafkaSinkConfig};
use super::sink_state::PendingTxn;
use super::txn::{self, fence, open_txn, send, Producer_, Txn};
use super::unblock;

/// Adds `marker` to the open transaction of `producer`.
///
/// # Errors
///
/// [`KafkaError::Client`] when the broker refuses it or times out.
pub(crate) fn send_marker(
    config: &KafkaSinkConfig,
    producer: &Producer_,
    group: &MarkerGroup,
    marker: &Marker,
) -> Result<(), KafkaError> {
    let (metadata, offsets) = group.offsets(marker)?;
    txn::ask_until_unreachable(config, "send_offsets_to_transaction (marker)", |timeout| {
        producer.send_offsets_to_transaction(&offsets, &metadata, timeout)
    })
}

/// Sets the marker to checkpoint 0 when it names a later one, in a
/// transaction of its own under `id` (which a restore fences anyway).
///
/// # Errors
///
/// [`KafkaError::Client`] when the broker refuses or times out.
pub(crate) fn reset_marker(
    config: &KafkaSinkConfig,
    group: &MarkerGroup,
    id: String,
) -> Result<(), KafkaError> {
    if group
        .read()?
        .map_or(true, |marker| marker.checkpoint_id == 0)
    {
        return Ok(());
    }
    let txn = open_txn(config, id)?;
    let marker = Marker {
        checkpoint_id: 0,
        first: 0,
        nonce: 0,
    };
    send_marker(config, &txn.producer, group, &marker)?;
    txn.producer
        .commit_transaction(Duration::from_millis(config.request_timeout_ms))
        .map_err(|source| KafkaError::client("commit_transaction (marker reset)", source))
}

/// What a marker read needs first: the factory's gate, which knows
/// whether a nudge is due, and the subtask's id prefix to nudge under.
pub(crate) struct Nudge<'a> {
    pub(crate) gate: &'a SendGate,
    pub(crate) prefix: &'a str,
}

/// Finishes `listed` (ascending by checkpoint) as the module describes.
///
/// # Errors
///
/// A [`KafkaError`] from the broker; what was committed stays committed,
/// and a retry (a restart) starts again from the first unfinished one.
pub(crate) fn finish(
    config: &KafkaSinkConfig,
    log: &CommitLog,
    group: &MarkerGroup,
    nudge: &Nudge<'_>,
    listed: &BTreeMap<u64, PendingTxn>,
) -> Result<(), KafkaError> {
    let mut marker: Option<Option<Marker>> = None;
    for (position, (&checkpoint_id, pending)) in listed.iter().enumerate() {
        if log.contains(&pending.header) {
            continue;
        }
        if registry::committed_here(&pending.header) {
            // Certain, where the marker may lag behind a commit made just
            // before (a savepoint's, resumed at once in this process).
            log.push(pending.header.clone());
            continue;
        }
        if let Some(txn) = registry::take(&pending.id) {
            commit_parked(config, log, txn)?;
            continue;
        }
        let read = match marker {
            Some(read) => read,
            None => {
                // Applies every commit the broker decided (see `unblock`).
                nudge
                    .gate
                    .nudge_once(|| unblock::nudge(config, nudge.prefix))?;
                let read = group.read()?;
                marker = Some(read);
                read
            }
        };
        let committed = read.map_or(Committed::No, |marker| marker.covers(checkpoint_id));
        tracing::info!(
            checkpoint_id,
            id = %pending.id,
            header = %pending.header,
            marker = ?read,
            ?committed,
            "a pending Kafka transaction of a process that died, as its commit marker tells"
        );
        let header = match (committed, read) {
            (Committed::No, _) => None,
            (Committed::ByMarker(nonce), Some(marker)) => Some(
                // The marker's transaction carried the records of every
                // pending one from `first` on under the id of its last;
                // without that entry (a fallback past it) only the listed
                // header is known.
                listed.get(&marker.checkpoint_id).map_or_else(
                    || pending.header.clone(),
                    |last| format!("{}#{nonce}", last.id),
                ),
            ),
            _ => Some(pending.header.clone()),
        };
        match header {
            Some(header) => {
                log.push(header);
                log.recovered.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                let rest: Vec<(u64, &PendingTxn)> = listed
                    .iter()
                    .skip(position)
                    .map(|(id, pending)| (*id, pending))
                    .collect();
                return rewrite(config, log, group, &rest);
            }
        }
    }
    Ok(())
}

/// Commits `txn` with the producer that opened it.
fn commit_parked(config: &KafkaSinkConfig, log: &CommitLog, txn: Txn) -> Result<(), KafkaError> {
    let committed = txn::ask_until_unreachable(config, "commit_transaction", |timeout| {
        txn.producer.commit_transaction(timeout)
    });
    match committed {
        Ok(()) => {
            registry::note_committed(&txn.header);
            log.push(txn.header.clone());
            Ok(())
        }
        Err(error) => {
            if error.is_retryable() {
                // Still pending: a later commit or restore tries again.
                registry::park(txn);
            }
            Err(error)
        }
    }
}

/// Writes the records of `rest` (ascending, none of them committed) again
/// in one new transaction under the last one's id, with a marker that
/// covers them all, after aborting or fencing each old one.
fn rewrite(
    config: &KafkaSinkConfig,
    log: &CommitLog,
    group: &MarkerGroup,
    rest: &[(u64, &PendingTxn)],
) -> Result<(), KafkaError> {
    let (Some(&(first, _)), Some(&(last, last_pending))) = (rest.first(), rest.last()) else {
        return Ok(());
    };
    let timeout = Duration::from_millis(config.request_timeout_ms);
    for (_, pending) in rest {
        // A kept one is behind one that must be written again: committing
        // it now would put it out of checkpoint order under the marker.
        // The last one's id is fenced by opening the new transaction.
        let aborted = registry::take(&pending.id)
            .is_some_and(|txn| txn.producer.abort_transaction(timeout).is_ok());
        if !aborted && pending.id != last_pending.id {
            fence(config, &pending.id)?;
        }
    }
    let mut txn = open_txn(config, last_pending.id.clone())?;
    let records: usize = rest.iter().map(|(_, pending)| pending.records.len()).sum();
    tracing::warn!(
        id = %last_pending.id,
        first,
        last,
        records,
        "pending Kafka transactions of a process that died were not committed; writing them again"
    );
    for (_, pending) in rest {
        for out in &pending.records {
            send(
                &txn.producer,
                &config.topic,
                out,
                Some(&txn.header),
                timeout,
            )?;
        }
    }
    let marker = Marker {
        checkpoint_id: last,
        first,
        nonce: txn.nonce,
    };
    send_marker(config, &txn.producer, group, &marker)?;
    txn::flush(&txn.producer, timeout)?;
    txn.watch.check()?;
    txn.records.clear();
    txn.producer
        .commit_transaction(timeout)
        .map_err(|source| KafkaError::client("commit_transaction (written again)", source))?;
    registry::note_committed(&txn.header);
    log.push(txn.header.clone());
    log.rewritten
        .fetch_add(rest.len() as u64, Ordering::Relaxed);
    Ok(())
}
