//! bank: Chandy-Lamport snapshots of a graph with a cycle. Accounts move
//! money to each other; a transfer debits one account, travels around a
//! feedback loop as a credit, and is credited to another account. Money is
//! never created or destroyed, so every consistent snapshot must hold the
//! initial total: the balances in the accounts' state *plus* the credits
//! caught in flight, which only a snapshot that records channel state (as
//! Chandy-Lamport does on the feedback edge) can see.
//!
//! The graph: `orders` (paced source of debits) → `transfers` (loop head) →
//! key_by account → `accounts` (keyed state: the account's balance change;
//! a debit emits a credit, a credit emits a settlement) → `in-flight`
//! (credits, back to the loop head) and `settled` → `ledger` (collect
//! sink). The planned crashes panic inside `accounts`.
//!
//! Reading a snapshot's total: the example wraps the file store in an
//! [`AuditedStore`] that, whenever a checkpoint commits, reads it back
//! through the public checkpoint reader ([`snapflow::job::inspect`]):
//! the accounts' keyed state plus the credits recorded in flight on the
//! feedback edge. At the end it also reads the latest checkpoint back from
//! the directory and checks its total.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use snapflow::job::inspect::{CheckpointView, InspectError};
use snapflow::job::{Feedback, Job, JobConfig, KeyedStateHandle, Stream};
use snapflow::protocol::SnapshotMode;
use snapflow::sink::CollectHandle;
use snapflow::storage::{
    CheckpointId, CheckpointKind, CheckpointMetadata, CheckpointPin, CheckpointStore,
    CheckpointSummary, CommitRequest, FsCheckpointStore, LoadReport, LoadedCheckpoint, PartId,
    PartInfo, StoreError,
};
use snapflow::Snapshot;

use crate::common::{
    check_crashes, fresh_store, positive, positive_u32, print_report, CommonArgs, CommonOptions,
    CrashPlan, ExampleError, ExampleOptions, PacedSource, Pacing, Rng,
};

/// The options of the bank example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Accounts.
    pub accounts: u32,
    /// Transfers.
    pub transfers: u64,
    /// Each account's opening balance.
    pub initial_balance: i64,
    /// Record every channel (unaligned) instead of aligning the forward
    /// edges and recording only the feedback edge (cyclic).
    pub unaligned: bool,
    /// Parallelism, crashes, checkpoints and pace.
    pub common: CommonOptions,
}

impl Options {
    fn initial_total(&self) -> i64 {
        i64::from(self.accounts) * self.initial_balance
    }
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            accounts: 50,
            transfers: 30_000,
            initial_balance: 1_000,
            unaligned: false,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        Options {
            accounts: 8,
            transfers: 800,
            initial_balance: 1_000,
            unaligned: false,
            common: CommonOptions::smoke(),
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            accounts: args.accounts.unwrap_or(defaults.accounts),
            transfers: args.transfers.unwrap_or(defaults.transfers),
            unaligned: args.unaligned || defaults.unaligned,
            common: args.common.apply(defaults.common),
            ..defaults
        }
    }
}

/// bank: Chandy-Lamport snapshots of a graph with a cycle; every
/// snapshot must hold the initial total, across injected crashes (exit
/// code 1 otherwise).
#[derive(Debug, clap::Parser)]
#[command(name = "bank", args_override_self = true)]
pub struct Args {
    /// Accounts [default: 50, 8 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive_u32)]
    accounts: Option<u32>,
    /// Transfers [default: 30000, 800 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    transfers: Option<u64>,
    /// Record every channel (unaligned) instead of aligning the forward
    /// edges and recording only the feedback edge.
    #[arg(long)]
    unaligned: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// What travels through the graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Order `order`: take `amount` from `from` and send it to `to`.
    Debit {
        /// The order number (its position in the input).
        order: u64,
        /// The paying account.
        from: u32,
        /// The receiving account.
        to: u32,
        /// How much.
        amount: i64,
    },
    /// Money of order `order` on its way to `to`.
    Credit {
        /// The order number.
        order: u64,
        /// The receiving account.
        to: u32,
        /// How much.
        amount: i64,
    },
    /// Order `order` was credited.
    Settled {
        /// The order number.
        order: u64,
    },
}

impl Message {
    /// The account whose state this message touches.
    pub(crate) fn account(&self) -> u32 {
        match self {
            Message::Debit { from, .. } => *from,
            Message::Credit { to, .. } => *to,
            // Settlements never reach the accounts; any key will do.
            Message::Settled { .. } => 0,
        }
    }

    /// Money this message carries in flight.
    pub(crate) fn in_flight(&self) -> i64 {
        match self {
            Message::Credit { amount, .. } => *amount,
            _ => 0,
        }
    }
}

/// One account's state: how its balance changed since it opened.
/// Overdrafts are allowed, so the final balances do not depend on the order
/// in which the accounts see debits and credits.
#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    /// Credits minus debits.
    pub change: i64,
    /// Debits and credits applied.
    pub operations: u64,
}

/// Runs the example; `Ok` only when every snapshot and the end hold the
/// initial total and every transfer settled exactly once.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let common = &options.common;
    let orders = generate(options.accounts, options.transfers);
    let crashes = CrashPlan::new(common.crashes.records(options.transfers));
    let store = fresh_store(&common.checkpoint_root, "bank")?;
    let mode = if options.unaligned {
        SnapshotMode::Unaligned
    } else {
        SnapshotMode::Aligned
    };
    println!(
        "bank: {} accounts of {} (total {}), {} transfers, parallelism {}, {} snapshots into {}",
        options.accounts,
        options.initial_balance,
        options.initial_total(),
        options.transfers,
        common.parallelism,
        if options.unaligned {
            "unaligned"
        } else {
            "cyclic (Chandy-Lamport on the feedback edge)"
        },
        store.job_dir().display()
    );
    println!(
        "  crashes planned in `accounts` at input records (orders) {:?}",
        crashes.records()
    );
    let audit = Arc::new(AuditedStore::new(
        store,
        Audit {
            accounts: options.accounts,
            initial_balance: options.initial_balance,
        },
    ));
    let config = JobConfig {
        mode,
        ..common.job_config(
            Arc::clone(&audit) as Arc<dyn CheckpointStore>,
            crashes.planned(),
        )
    };
    let job = Job::new("bank", config);
    let (ledger, balances) = declare(&job, orders.clone(), common.pacing(), &crashes);
    let report = common.run(job)?;
    print_report(&report);

    let audits = audit.audits();
    check_crashes(&crashes, &report)?;
    check_snapshots(&audits, options.initial_total())?;
    let latest = audit.check_latest_on_disk()?;
    println!(
        "latest checkpoint {} read back from disk: total {}",
        latest.checkpoint, latest.total
    );
    check_snapshots(std::slice::from_ref(&latest), options.initial_total())?;
    check_final(options, &orders, &balances.snapshot(), &ledger.committed())?;
    println!(
        "check: OK, all {} snapshots held the initial total {}, every transfer settled exactly \
         once and the final balances equal a direct computation, despite {} crashes",
        audits.len(),
        options.initial_total(),
        report.restarts.len()
    );
    Ok(())
}

/// orders → transfers (loop head) → key_by account → accounts → in-flight
/// (back to the head) and settled → ledger.
fn declare(
    job: &Job,
    orders: Vec<Message>,
    pacing: Pacing,
    crashes: &CrashPlan,
) -> (CollectHandle<Message>, KeyedStateHandle<u32, Account>) {
    let ledger = CollectHandle::new();
    let sink = ledger.clone();
    let crashes = crashes.clone();
    // A credit comes back within milliseconds; half a second without one
    // means the loop is drained once the orders have ended. (A credit
    // delayed longer would be dropped by the loop's end and the final check
    // would fail loudly, not silently.)
    let (head, feedback) = job
        .source("orders", PacedSource::new(orders, pacing))
        .iterate("transfers", 500);
    let (moved, balances) = head.key_by(Message::account).process_with_state(
        "accounts",
        move |_account: &u32, account: &mut Account, message: Message, out| {
            if let Message::Debit { order, .. } = message {
                crashes.check(order);
            }
            if let Some(next) = apply(account, message) {
                out.emit(next);
            }
            Ok(())
        },
    );
    close_and_settle(moved, feedback, sink);
    (ledger, balances)
}

/// Credits go back to the loop head (`in-flight`), settlements to the
/// ledger (`settled` → `ledger`).
pub(crate) fn close_and_settle<'j>(
    moved: Stream<'j, Message>,
    feedback: Feedback<'j, Message>,
    ledger: CollectHandle<Message>,
) {
    moved
        .clone()
        .filter("in-flight", |message: &Message| {
            matches!(message, Message::Credit { .. })
        })
        .close_loop(feedback);
    moved
        .filter("settled", |message: &Message| {
            matches!(message, Message::Settled { .. })
        })
        .sink("ledger", ledger);
}

/// One account's step: a debit sends a credit on, a credit settles.
fn apply(account: &mut Account, message: Message) -> Option<Message> {
    account.operations += 1;
    apply_to(&mut account.change, message)
}

/// One step on an account's balance change alone.
pub(crate) fn apply_to(change: &mut i64, message: Message) -> Option<Message> {
    match message {
        Message::Debit {
            order, to, amount, ..
        } => {
            *change -= amount;
            Some(Message::Credit { order, to, amount })
        }
        Message::Credit { order, amount, .. } => {
            *change += amount;
            Some(Message::Settled { order })
        }
        Message::Settled { .. } => None,
    }
}

/// Random transfers between distinct accounts.
pub(crate) fn generate(accounts: u32, transfers: u64) -> Vec<Message> {
    let mut rng = Rng::new(11);
    (0..transfers)
        .map(|order| {
            let from = rng.below(u64::from(accounts)) as u32;
            // Another account whenever there are two or more.
            let step = 1 + rng.below(u64::from(accounts.max(2) - 1)) as u32;
            let to = (from + step) % accounts;
            let amount = 1 + rng.below(100) as i64;
            Message::Debit {
                order,
                from,
                to,
                amount,
            }
        })
        .collect()
}

fn check_snapshots(audits: &[SnapshotAudit], initial_total: i64) -> Result<(), ExampleError> {
    if audits.is_empty() {
        return Err(ExampleError::Mismatch("no snapshot completed".into()));
    }
    if let Some(error) = audits.iter().find_map(|audit| audit.error.clone()) {
        return Err(ExampleError::Decode(error));
    }
    match audits.iter().find(|audit| audit.total != initial_total) {
        Some(audit) => Err(ExampleError::Mismatch(format!(
            "snapshot {} holds {} instead of {initial_total}",
            audit.checkpoint, audit.total
        ))),
        None => Ok(()),
    }
}

fn check_final(
    options: &Options,
    orders: &[Message],
    balances: &std::collections::HashMap<u32, Account>,
    ledger: &[Message],
) -> Result<(), ExampleError> {
    let mut expected: BTreeMap<u32, i64> = BTreeMap::new();
    for order in orders {
        if let Message::Debit {
            from, to, amount, ..
        } = order
        {
            *expected.entry(*from).or_default() -= amount;
            *expected.entry(*to).or_default() += amount;
        }
    }
    for (account, change) in &expected {
        let actual = balances.get(account).map_or(0, |account| account.change);
        if actual != *change {
            return Err(ExampleError::Mismatch(format!(
                "account {account} changed by {actual} instead of {change}"
            )));
        }
    }
    let total: i64 =
        options.initial_total() + balances.values().map(|account| account.change).sum::<i64>();
    println!("final total {total}");
    if total != options.initial_total() {
        return Err(ExampleError::Mismatch(format!(
            "the final total is {total} instead of {}",
            options.initial_total()
        )));
    }
    let mut settled = BTreeSet::new();
    for message in ledger {
        if let Message::Settled { order } = message {
            if !settled.insert(*order) {
                return Err(ExampleError::Mismatch(format!(
                    "order {order} settled twice"
                )));
            }
        }
    }
    if settled.len() as u64 != options.transfers {
        return Err(ExampleError::Mismatch(format!(
            "{} orders settled instead of {}",
            settled.len(),
            options.transfers
        )));
    }
    Ok(())
}

/// What one completed snapshot held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotAudit {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Balances plus money in flight.
    pub total: i64,
    /// Money in flight (credits recorded as channel state).
    pub in_flight: i64,
    /// Why the checkpoint could not be decoded, if it could not.
    pub error: Option<String>,
}

/// How to turn a checkpoint into a total.
#[derive(Debug, Clone, Copy)]
struct Audit {
    accounts: u32,
    initial_balance: i64,
}

impl Audit {
    /// Reads the snapshot's balances and the credits recorded in flight
    /// through the public checkpoint reader.
    fn of_view(&self, view: &CheckpointView) -> Result<SnapshotAudit, InspectError> {
        let accounts = view.keyed_state::<u32, Account>("accounts")?;
        let mut in_flight = Vec::new();
        for part in view.parts() {
            // Every channel of this graph carries `Message`s.
            in_flight.extend(part.all_channel_records::<Message>()?);
        }
        Ok(self.total(view.checkpoint(), accounts.values(), &in_flight))
    }

    /// Balances plus money in flight.
    fn total<'a>(
        &self,
        checkpoint: CheckpointId,
        accounts: impl Iterator<Item = &'a Account>,
        in_flight: &[Message],
    ) -> SnapshotAudit {
        let changes: i64 = accounts.map(|account| account.change).sum();
        let in_flight: i64 = in_flight.iter().map(Message::in_flight).sum();
        let balances = i64::from(self.accounts) * self.initial_balance + changes;
        SnapshotAudit {
            checkpoint,
            total: balances + in_flight,
            in_flight,
            error: None,
        }
    }
}

/// The file store, plus an audit of every checkpoint it commits: once a
/// commit is durable it reads the checkpoint back through
/// [`CheckpointView`], computes the snapshot's total and prints it.
pub struct AuditedStore {
    inner: FsCheckpointStore,
    audit: Audit,
    audits: Mutex<Vec<SnapshotAudit>>,
}

impl fmt::Debug for AuditedStore {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("AuditedStore")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data stays consistent if a holder panicked: each update is one
    // push.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl AuditedStore {
    fn new(inner: FsCheckpointStore, audit: Audit) -> AuditedStore {
        AuditedStore {
            inner,
            audit,
            audits: Mutex::new(Vec::new()),
        }
    }

    /// Every committed checkpoint's audit, in commit order.
    pub fn audits(&self) -> Vec<SnapshotAudit> {
        lock(&self.audits).clone()
    }

    /// Loads the latest checkpoint back from the directory and audits it.
    fn check_latest_on_disk(&self) -> Result<SnapshotAudit, ExampleError> {
        let view = CheckpointView::latest(&self.inner)
            .map_err(|error| ExampleError::Decode(error.to_string()))?;
        self.audit
            .of_view(&view)
            .map_err(|error| ExampleError::Decode(error.to_string()))
    }

    fn on_commit(&self, checkpoint: CheckpointId) {
        let audit = CheckpointView::load(&self.inner, checkpoint)
            .and_then(|view| self.audit.of_view(&view))
            .unwrap_or_else(|error| SnapshotAudit {
                checkpoint,
                total: 0,
                in_flight: 0,
                error: Some(error.to_string()),
            });
        match &audit.error {
            None => println!(
                "  snapshot {checkpoint}: total {} ({} in accounts, {} in flight on the loop)",
                audit.total,
                audit.total - audit.in_flight,
                audit.in_flight
            ),
            Some(error) => println!("  snapshot {checkpoint}: could not decode: {error}"),
        }
        lock(&self.audits).push(audit);
    }
}

impl CheckpointStore for AuditedStore {
    fn job(&self) -> &str {
        self.inner.job()
    }

    fn begin(&self, checkpoint: CheckpointId, kind: CheckpointKind) -> Result<(), StoreError> {
        self.inner.begin(checkpoint, kind)
    }

    fn write_part(
        &self,
        checkpoint: CheckpointId,
        part: &PartId,
        bytes: &[u8],
    ) -> Result<PartInfo, StoreError> {
        self.inner.write_part(checkpoint, part, bytes)
    }

    fn commit(
        &self,
        checkpoint: CheckpointId,
        request: CommitRequest,
    ) -> Result<CheckpointMetadata, StoreError> {
        let metadata = self.inner.commit(checkpoint, request)?;
        self.on_commit(checkpoint);
        Ok(metadata)
    }

    fn discard(&self, checkpoint: CheckpointId) -> Result<(), StoreError> {
        self.inner.discard(checkpoint)
    }

    fn list(&self) -> Result<Vec<CheckpointSummary>, StoreError> {
        self.inner.list()
    }

    fn load(&self, checkpoint: CheckpointId) -> Result<LoadedCheckpoint, StoreError> {
        self.inner.load(checkpoint)
    }

    fn load_latest(&self) -> Result<LoadReport, StoreError> {
        self.inner.load_latest()
    }

    fn load_latest_before(&self, before: CheckpointId) -> Result<LoadReport, StoreError> {
        self.inner.load_latest_before(before)
    }

    fn highest_id(&self) -> Result<Option<CheckpointId>, StoreError> {
        self.inner.highest_id()
    }

    fn set_aside(
        &self,
        checkpoint: CheckpointId,
        reason: &str,
    ) -> Result<Option<std::path::PathBuf>, StoreError> {
        self.inner.set_aside(checkpoint, reason)
    }

    fn damaged_ids(&self) -> Result<Vec<CheckpointId>, StoreError> {
        self.inner.damaged_ids()
    }

    fn location(&self) -> Option<&std::path::Path> {
        self.inner.location()
    }

    fn pin(&self, checkpoint: CheckpointId) -> Result<CheckpointPin, StoreError> {
        self.inner.pin(checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn total(changes: &[i64], credits: &[i64]) -> SnapshotAudit {
        let audit = Audit {
            accounts: 3,
            initial_balance: 100,
        };
        let accounts: Vec<Account> = changes
            .iter()
            .map(|&change| Account {
                change,
                operations: 1,
            })
            .collect();
        let in_flight: Vec<Message> = credits
            .iter()
            .map(|&amount| Message::Credit {
                order: 0,
                to: 1,
                amount,
            })
            .chain(std::iter::once(Message::Settled { order: 0 }))
            .collect();
        audit.total(7, accounts.iter(), &in_flight)
    }

    #[test]
    fn money_in_flight_counts_towards_the_total() {
        let audit = total(&[-30, 10], &[20]);
        assert_eq!((audit.total, audit.in_flight), (300, 20));
    }

    #[test]
    fn a_snapshot_that_misses_money_in_flight_is_a_mismatch() {
        let audit = total(&[-30], &[]);
        let error = check_snapshots(&[audit], 300).expect_err("30 are missing");
        assert!(matches!(error, ExampleError::Mismatch(_)));
    }

    #[test]
    fn a_snapshot_that_did_not_decode_is_a_decode_error() {
        let audit = SnapshotAudit {
            error: Some("bad bytes".into()),
            ..total(&[], &[])
        };
        let error = check_snapshots(&[audit], 300).expect_err("not decoded");
        assert!(matches!(error, ExampleError::Decode(_)));
    }

    #[test]
    fn transfers_go_to_another_account() {
        for message in generate(5, 1_000) {
            let Message::Debit {
                from, to, amount, ..
            } = message
            else {
                panic!("orders are debits");
            };
            assert!(from != to && to < 5 && (1..=100).contains(&amount));
        }
    }
}
