//! The process-wide table of pre-committed Kafka transactions: each one's
//! live producer, kept by transactional id until a sink commits or aborts
//! it.
//!
//! This module exists because librdkafka cannot resume a transaction
//! another producer object opened: a new producer with the same
//! transactional id *aborts* it (that is Kafka's fencing). A sink that
//! failed in this process leaves its pre-committed transactions here, and
//! the sink that restores its subtask takes them out and commits them
//! with the producer that opened them. After a process crash the table
//! is gone; see the sink module for what that costs. This module owns
//! the table and its bound; it never talks to the broker.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::txn::Txn;

/// At most this many transactions wait here; past it the oldest is
/// dropped (its producer closes and the broker aborts the transaction at
/// its time-out). A subtask has a handful pending at a time, so only
/// thousands of subtasks whose restores never came reach it.
pub(crate) const PARKED_MAX: usize = 4_096;

#[derive(Default)]
struct Table {
    by_id: BTreeMap<String, Txn>,
    order: VecDeque<String>,
}

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    let table = TABLE.get_or_init(|| Mutex::new(Table::default()));
    // A panic while holding the lock leaves a table that is still
    // consistent (every operation is one insert or remove).
    table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Keeps `txn` under its transactional id.
pub(crate) fn park(txn: Txn) {
    let mut table = table();
    let id = txn.id.clone();
    if table.by_id.insert(id.clone(), txn).is_none() {
        table.order.push_back(id);
    }
    while table.by_id.len() > PARKED_MAX {
        let Some(oldest) = table.order.pop_front() else {
            break;
        };
        if let Some(dropped) = table.by_id.remove(&oldest) {
            tracing::warn!(id = %dropped.id, "a parked Kafka transaction was dropped: too many parked");
        }
    }
}

/// Takes out the transaction with this id, if this process has it.
pub(crate) fn take(id: &str) -> Option<Txn> {
    let mut table = table();
    let txn = table.by_id.remove(id)?;
    table.order.retain(|parked| parked != id);
    Some(txn)
}

/// Takes out every transaction whose id starts with `prefix`.
pub(crate) fn take_prefixed(prefix: &str) -> Vec<Txn> {
    let mut table = table();
    let ids: Vec<String> = table
        .by_id
        .keys()
        .filter(|id| id.starts_with(prefix))
        .cloned()
        .collect();
    let mut taken = Vec::with_capacity(ids.len());
    for id in ids {
        if let Some(txn) = table.by_id.remove(&id) {
            taken.push(txn);
        }
        table.order.retain(|parked| *parked != id);
    }
    taken
}
