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
//! is gone; see the sink module for what that costs.
//!
//! Beside it, the headers of the transactions this process committed
//! (the newest [`COMMITTED_MAX`]): a sink of another factory in the same
//! process (a job stopped with a savepoint and resumed in the same
//! process) finds there for certain that a pending transaction its state
//! lists was committed, where the commit marker may not show it yet (on
//! the test broker, tansu 0.6, a committed marker sometimes shows only
//! a while after `commit_transaction` returned; see docs/design/kafka-connector.md).
//!
//! And the transactions being opened ahead of need
//! ([`open_ahead`](super::txn::open_ahead)), each on a thread of its own,
//! by id, so that a restore can wait for those of a failed incarnation
//! before it initialises the same ids.
//!
//! This module owns the three tables and their bounds; it never talks to
//! the broker.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;

use super::error::KafkaError;
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

/// The table in `cell`, made at the first use. A panic while holding a
/// table's lock leaves it consistent (every operation on any of them is
/// one insert or remove, or a count), so a poisoned lock is taken anyway.
fn lock<T: Default>(cell: &'static OnceLock<Mutex<T>>) -> MutexGuard<'static, T> {
    cell.get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    lock(&TABLE)
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

/// Whether a producer of this process holds the transaction `id`.
pub(crate) fn holds(id: &str) -> bool {
    table().by_id.contains_key(id)
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

/// An opening of a transaction ahead of need (see
/// [`open_ahead`](super::txn::open_ahead)).
pub(crate) type Opening = JoinHandle<Result<Txn, KafkaError>>;

/// Past this many openings waiting, those that ended are dropped (their
/// owners open again, synchronously); a subtask has at most one, so only
/// jobs that ended without taking theirs (a cancelled job, a failover
/// whose restore did not come yet) leave them, and no new one is started
/// while the table stays this full.
pub(crate) const OPENINGS_MAX: usize = 256;

fn openings() -> MutexGuard<'static, BTreeMap<String, Opening>> {
    static OPENINGS: OnceLock<Mutex<BTreeMap<String, Opening>>> = OnceLock::new();
    lock(&OPENINGS)
}

/// Whether another opening may start: the table holds fewer than
/// [`OPENINGS_MAX`], after dropping the openings that ended when it was
/// full.
pub(crate) fn room_for_opening() -> bool {
    let mut openings = openings();
    if openings.len() >= OPENINGS_MAX {
        openings.retain(|_, opening| !opening.is_finished());
    }
    openings.len() < OPENINGS_MAX
}

/// Keeps `opening` under its transactional id. An earlier opening of the
/// same id (a failed incarnation's) is waited for and dropped first, so
/// the later one initialises last.
pub(crate) fn put_opening(id: String, opening: Opening) {
    let earlier = openings().insert(id, opening);
    if let Some(earlier) = earlier {
        let _ = earlier.join();
    }
}

/// Takes out the opening of this id, if there is one.
pub(crate) fn take_opening(id: &str) -> Option<Opening> {
    openings().remove(id)
}

/// Takes out every opening whose id starts with `prefix`.
pub(crate) fn take_openings_prefixed(prefix: &str) -> Vec<Opening> {
    let mut openings = openings();
    let ids: Vec<String> = openings
        .keys()
        .filter(|id| id.starts_with(prefix))
        .cloned()
        .collect();
    ids.into_iter()
        .filter_map(|id| openings.remove(&id))
        .collect()
}

/// At most this many committed transactions are remembered; the oldest
/// are forgotten first (a restore needs only the last few of a subtask).
pub(crate) const COMMITTED_MAX: usize = 4_096;

#[derive(Default)]
struct Committed {
    headers: BTreeSet<String>,
    order: VecDeque<String>,
}

fn committed() -> MutexGuard<'static, Committed> {
    static COMMITTED: OnceLock<Mutex<Committed>> = OnceLock::new();
    lock(&COMMITTED)
}

/// Notes that `commit_transaction` returned success in this process for
/// the transaction whose records carry `header`.
pub(crate) fn note_committed(header: &str) {
    let mut committed = committed();
    if committed.headers.insert(header.to_owned()) {
        committed.order.push_back(header.to_owned());
    }
    while committed.order.len() > COMMITTED_MAX {
        if let Some(oldest) = committed.order.pop_front() {
            committed.headers.remove(&oldest);
        }
    }
}

/// Whether this process committed the transaction whose records carry
/// `header` (among the newest [`COMMITTED_MAX`]).
pub(crate) fn committed_here(header: &str) -> bool {
    committed().headers.contains(header)
}

/// The subtasks (by their id prefix) that have a restored sink alive in
/// this process, with how many: a restore of another region checks every
/// sink subtask, and must not fence the transactions of one that runs
/// (see [`unblock`](super::unblock)). Bounded by the sink subtasks of the
/// process's jobs: each one counts once, and its drop takes it out.
fn live() -> MutexGuard<'static, BTreeMap<String, usize>> {
    static LIVE: OnceLock<Mutex<BTreeMap<String, usize>>> = OnceLock::new();
    lock(&LIVE)
}

/// Counts a restored sink of the subtask `prefix` as alive.
pub(crate) fn add_live(prefix: &str) {
    *live().entry(prefix.to_owned()).or_default() += 1;
}

/// Takes one restored sink of the subtask `prefix` out (its drop).
pub(crate) fn remove_live(prefix: &str) {
    let mut live = live();
    if let Some(count) = live.get_mut(prefix) {
        *count -= 1;
        if *count == 0 {
            live.remove(prefix);
        }
    }
}

/// Whether a restored sink of the subtask `prefix` is alive here.
pub(crate) fn is_live(prefix: &str) -> bool {
    live().contains_key(prefix)
}

/// At most this many fenced ids wait for their restore; past it the
/// oldest are forgotten (their restore fences them again).
pub(crate) const FENCED_MAX: usize = 4_096;

/// Ids a restore's check fenced, which its restore then need not fence
/// again (see [`unblock`](super::unblock)).
fn fenced() -> MutexGuard<'static, VecDeque<String>> {
    static FENCED: OnceLock<Mutex<VecDeque<String>>> = OnceLock::new();
    lock(&FENCED)
}

/// Notes that `ids` were fenced and nothing opened them since.
pub(crate) fn note_fenced(ids: &[String]) {
    let mut fenced = fenced();
    for id in ids {
        if !fenced.contains(id) {
            fenced.push_back(id.clone());
        }
    }
    while fenced.len() > FENCED_MAX {
        fenced.pop_front();
    }
}

/// Whether `id` was fenced with nothing opening it since; it is
/// forgotten either way (its restore opens or fences it now).
pub(crate) fn take_fenced(id: &str) -> bool {
    let mut fenced = fenced();
    let before = fenced.len();
    fenced.retain(|fenced| fenced != id);
    fenced.len() != before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_table_remembers_the_newest_and_forgets_the_oldest() {
        let header = |n: usize| format!("registry-test-{n}#1");
        for n in 0..=COMMITTED_MAX {
            note_committed(&header(n));
        }
        assert!(!committed_here(&header(0)), "the oldest is forgotten");
        assert!(committed_here(&header(1)));
        assert!(committed_here(&header(COMMITTED_MAX)));
        assert!(!committed_here("registry-test-never#1"));
    }
}
