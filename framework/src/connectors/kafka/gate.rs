//! The exactly-once sink's send gate: records written after a
//! pre-commit wait in the sink (they are kept for the sink state anyway)
//! until every transaction the factory's sinks pre-committed is
//! committed, and until every subtask that must read its commit marker
//! has read it.
//!
//! Why: tansu 0.6, the test broker, decides a commit at once but applies
//! its transactional offsets (the commit marker) and moves the
//! partition's last stable offset only when every other transaction with
//! records in that partition that started before it ended has asked to
//! end as well. A transaction of the next interval that already holds
//! records would keep the commit before it half-done until it ends
//! itself, and the one after it the same, so with records flowing the
//! markers and `read_committed` readers never caught up while the job
//! ran (see docs/design/kafka-connector.md). Holding the next records back for
//! the few milliseconds between a checkpoint's barrier and its commit
//! keeps commits whole. On Kafka the gate costs that latency and nothing
//! else.
//!
//! This module owns the counts; it never talks to the broker and never
//! holds records (the sink does).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// At most this many records of one subtask wait for the gate; past it
/// the sink sends them anyway (and a commit it then overlaps completes
/// later, as without the gate). One checkpoint interval's output is
/// held in the sink state regardless, so this bounds only how long
/// records may wait, not memory.
pub(crate) const HELD_MAX: usize = 100_000;

/// The gate shared by the sinks of one factory.
#[derive(Debug, Default)]
pub(crate) struct SendGate {
    /// Pre-committed, not yet committed transactions of every subtask.
    pending: AtomicUsize,
    /// Subtasks whose restore must still read the commit marker.
    restoring: Mutex<BTreeSet<usize>>,
    restoring_count: AtomicUsize,
    /// Whether a restore must end a nudge transaction before the first
    /// marker read (see [`unblock`](super::unblock)): one per recovery
    /// is enough, after every subtask's check fenced its ids.
    nudge_needed: Mutex<bool>,
}

impl SendGate {
    /// Whether records may go to the broker now.
    pub(crate) fn is_open(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
            && self.restoring_count.load(Ordering::Acquire) == 0
    }

    /// Moves the pending count from `before` to `now` for one subtask.
    pub(crate) fn report_pending(&self, before: usize, now: usize) {
        if now > before {
            self.pending.fetch_add(now - before, Ordering::AcqRel);
        } else if before > now {
            self.pending.fetch_sub(before - now, Ordering::AcqRel);
        }
    }

    /// Marks whether `subtask`'s coming restore reads its commit marker.
    pub(crate) fn set_restoring(&self, subtask: usize, restoring: bool) {
        let mut set = self
            .restoring
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if restoring {
            set.insert(subtask);
        } else {
            set.remove(&subtask);
        }
        self.restoring_count.store(set.len(), Ordering::Release);
    }
}

impl SendGate {
    /// Asks for one nudge before the next marker read.
    pub(crate) fn need_nudge(&self) {
        *self.lock_nudge() = true;
    }

    /// Runs `nudge` if one is needed, once: a restore that reads its
    /// marker meanwhile waits for it here, so that no marker is read
    /// before the nudge ended.
    ///
    /// # Errors
    ///
    /// `nudge`'s error; the next caller tries again.
    pub(crate) fn nudge_once<E>(&self, nudge: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut needed = self.lock_nudge();
        if *needed {
            nudge()?;
            *needed = false;
        }
        Ok(())
    }

    fn lock_nudge(&self) -> std::sync::MutexGuard<'_, bool> {
        self.nudge_needed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_opens_when_nothing_is_pending_and_nobody_restores() {
        let gate = SendGate::default();
        assert!(gate.is_open());
        gate.report_pending(0, 2);
        assert!(!gate.is_open());
        gate.set_restoring(1, true);
        gate.report_pending(2, 0);
        assert!(!gate.is_open(), "subtask 1 still restores");
        gate.set_restoring(1, true);
        gate.set_restoring(1, false);
        assert!(gate.is_open());
    }

    #[test]
    fn a_nudge_runs_once_when_needed_and_again_after_a_failure() {
        let gate = SendGate::default();
        let mut runs = 0;
        gate.nudge_once(|| -> Result<(), ()> {
            runs += 1;
            Ok(())
        })
        .unwrap();
        assert_eq!(runs, 0, "not needed");
        gate.need_nudge();
        assert!(gate.nudge_once(|| Err(())).is_err());
        for _ in 0..2 {
            gate.nudge_once(|| -> Result<(), ()> {
                runs += 1;
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(runs, 1, "once after the failed one");
    }
}
