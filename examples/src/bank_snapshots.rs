//! bank_snapshots: Chandy-Lamport in full. The accounts themselves start
//! global snapshots, at random moments and concurrently with each other,
//! with snapshots the caller starts through `RunningJob::snapshot`, and
//! with the job's periodic recovery checkpoints; and the transfer loop
//! ends when a snapshot proves it quiescent, not after a timeout.
//!
//! The graph is the bank's (see [`crate::bank`]): `orders` → `transfers`
//! (loop head, [`Stream::iterate_until_quiescent`](snapflow::job::Stream::iterate_until_quiescent))
//! → `accounts` (a custom operator: each subtask keeps the balance change
//! of every account it has seen) → `in-flight` (credits, back to the head)
//! and `settled` → `ledger`. Each `accounts` subtask asks for a snapshot
//! through its [`OperatorContext`] after a random number of records, keeps
//! at most a few requests open, and polls them as records arrive.
//!
//! What it checks: every snapshot handed back, whoever started it, holds
//! the initial total: the balances in the `accounts` states plus the
//! credits recorded in flight on any channel (with concurrent snapshots
//! every channel is recorded). Every transfer settles exactly once, the
//! final balances equal a direct computation, the periodic checkpoints
//! kept completing (none failed), and the loop was ended by a snapshot.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use snapflow::job::snapshots::{GlobalSnapshot, SnapshotReceiver, SnapshotStarter};
use snapflow::job::{Collector, Job, JobConfig, Operator, OperatorContext};
use snapflow::runtime::BoxError;
use snapflow::sink::CollectHandle;
use snapflow::storage::MemoryCheckpointStore;
use snapflow::Snapshot;

use crate::bank::{apply_to, close_and_settle, generate, Message};
use crate::common::{
    positive, positive_u32, print_report, CommonArgs, CommonOptions, ExampleError, ExampleOptions,
    PacedSource, Rng,
};

/// The options of the example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Accounts.
    pub accounts: u32,
    /// Transfers.
    pub transfers: u64,
    /// Each account's opening balance.
    pub initial_balance: i64,
    /// On average, records between two snapshots one subtask starts.
    pub records_per_snapshot: u64,
    /// Snapshots the caller starts while the job runs.
    pub caller_snapshots: u32,
    /// Parallelism, checkpoints and pace (crash options are ignored:
    /// this example shows snapshots, the bank example shows recovery).
    pub common: CommonOptions,
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            accounts: 50,
            transfers: 30_000,
            initial_balance: 1_000,
            records_per_snapshot: 2_000,
            caller_snapshots: 10,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        Options {
            accounts: 8,
            transfers: 3_000,
            initial_balance: 1_000,
            records_per_snapshot: 150,
            caller_snapshots: 3,
            common: CommonOptions {
                records_per_second: 20_000,
                ..CommonOptions::smoke()
            },
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            accounts: args.accounts.unwrap_or(defaults.accounts),
            transfers: args.transfers.unwrap_or(defaults.transfers),
            records_per_snapshot: args
                .records_per_snapshot
                .unwrap_or(defaults.records_per_snapshot),
            caller_snapshots: args.caller_snapshots.unwrap_or(defaults.caller_snapshots),
            common: args.common.apply(defaults.common),
            ..defaults
        }
    }
}

/// bank_snapshots: concurrent global snapshots started by the accounts
/// and by the caller beside the periodic checkpoints; every one must hold
/// the initial total (exit code 1 otherwise). The crash flags are
/// accepted and ignored: this example shows snapshots, not recovery.
#[derive(Debug, clap::Parser)]
#[command(name = "bank_snapshots", args_override_self = true)]
pub struct Args {
    /// Accounts [default: 50, 8 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive_u32)]
    accounts: Option<u32>,
    /// Transfers [default: 30000, 3000 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    transfers: Option<u64>,
    /// On average, records between two snapshots one subtask starts
    /// [default: 2000, 150 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    records_per_snapshot: Option<u64>,
    /// Snapshots the caller starts while the job runs [default: 10, 3
    /// with --smoke].
    #[arg(long, value_name = "N", value_parser = positive_u32)]
    caller_snapshots: Option<u32>,
    #[command(flatten)]
    common: CommonArgs,
}

/// How many snapshot requests one subtask keeps open at once.
const OPEN_REQUESTS_MAX: usize = 3;

/// What the accounts hand over: every snapshot they received.
#[derive(Debug, Clone, Default)]
struct Received {
    snapshots: Arc<Mutex<Vec<Result<GlobalSnapshot, String>>>>,
}

impl Received {
    fn lock(&self) -> MutexGuard<'_, Vec<Result<GlobalSnapshot, String>>> {
        self.snapshots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One `accounts` subtask: the balance change of each account (index =
/// account), and the snapshots it asked for.
#[derive(Snapshot, Default)]
pub struct Accounts {
    /// Credits minus debits, per account.
    pub changes: Vec<i64>,
    #[snapshot(skip)]
    starter: Option<SnapshotStarter>,
    #[snapshot(skip)]
    open: Vec<SnapshotReceiver>,
    #[snapshot(skip)]
    countdown: u64,
    #[snapshot(skip)]
    rng: Option<Rng>,
    #[snapshot(skip)]
    mean_gap: u64,
    #[snapshot(skip)]
    received: Received,
}

impl Accounts {
    fn poll(&mut self) {
        let received = &self.received;
        self.open.retain(|receiver| match receiver.try_take() {
            None => true,
            Some(answer) => {
                received
                    .lock()
                    .push(answer.map_err(|error| error.to_string()));
                false
            }
        });
    }

    fn maybe_start(&mut self) {
        if self.countdown > 0 {
            self.countdown -= 1;
            return;
        }
        let gap = self.mean_gap.max(1) * 2;
        self.countdown = self.rng.as_mut().map_or(gap / 2, |rng| rng.below(gap));
        if self.open.len() < OPEN_REQUESTS_MAX {
            if let Some(starter) = &self.starter {
                self.open.push(starter.start());
            }
        }
    }
}

impl Operator for Accounts {
    type In = Message;
    type Out = Message;

    fn on_record(
        &mut self,
        message: Message,
        out: &mut Collector<'_, Message>,
    ) -> Result<(), BoxError> {
        let account = message.account() as usize;
        if self.changes.len() <= account {
            self.changes.resize(account + 1, 0);
        }
        if let Some(next) = apply_to(&mut self.changes[account], message) {
            out.emit(next);
        }
        self.poll();
        self.maybe_start();
        Ok(())
    }

    fn restore_from(&mut self, restored: Self) {
        self.changes = restored.changes;
    }

    fn on_end_of_input(&mut self, _out: &mut Collector<'_, Message>) -> Result<(), BoxError> {
        // Requests still open are answered by the supervisor; the receivers
        // go with the operator, so they are dropped here, counted as lost.
        self.poll();
        Ok(())
    }
}

/// A snapshot's total: initial balances plus every subtask's changes plus
/// the credits recorded in flight towards being credited.
fn total_of(snapshot: &GlobalSnapshot, initial_total: i64) -> Result<(i64, i64), ExampleError> {
    let view = snapshot.view();
    let decode =
        |error: snapflow::job::inspect::InspectError| ExampleError::Decode(error.to_string());
    let states = view
        .operator_states::<Accounts>("accounts")
        .map_err(decode)?;
    let changes: i64 = states.iter().flat_map(|state| state.changes.iter()).sum();
    // Credits on their way to be credited: towards the `in-flight` filter
    // (which passes them), the loop head and the accounts. The copies of
    // the same records on their way to the `settled` filter are dropped
    // there and carry no money.
    let mut in_flight = 0;
    for operator in ["in-flight", "transfers", "accounts"] {
        let records = view.channel_records::<Message>(operator).map_err(decode)?;
        in_flight += records.iter().map(Message::in_flight).sum::<i64>();
    }
    Ok((initial_total + changes + in_flight, in_flight))
}

/// Runs the example; `Ok` only when every snapshot held the initial total.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let common = &options.common;
    let initial_total = i64::from(options.accounts) * options.initial_balance;
    let orders = generate(options.accounts, options.transfers);
    println!(
        "bank_snapshots: {} accounts of {} (total {}), {} transfers, parallelism {}; accounts start a \
         snapshot about every {} records, the caller {} times, checkpoints every {} ms",
        options.accounts,
        options.initial_balance,
        initial_total,
        options.transfers,
        common.parallelism,
        options.records_per_snapshot,
        options.caller_snapshots,
        common.checkpoint_interval_ms,
    );
    let store = Arc::new(MemoryCheckpointStore::new("bank_snapshots")?);
    let job = Job::new(
        "bank_snapshots",
        JobConfig {
            checkpoint_interval_ms: Some(common.checkpoint_interval_ms),
            default_parallelism: common.parallelism,
            store: Some(store),
            ..JobConfig::default()
        },
    );
    let received = Received::default();
    let ledger = CollectHandle::new();
    let (head, feedback) = job
        .source("orders", PacedSource::new(orders.clone(), common.pacing()))
        .iterate_until_quiescent("transfers");
    let mean_gap = options.records_per_snapshot;
    let handed = received.clone();
    // Rebalanced, so that at every parallelism the job is one failover
    // region and every snapshot covers every account.
    let moved = head
        .rebalance()
        .operator("accounts", move |context: &OperatorContext| Accounts {
            starter: Some(context.snapshots.clone()),
            rng: Some(Rng::new(1 + context.subtask as u64)),
            countdown: mean_gap / 2,
            mean_gap,
            received: handed.clone(),
            ..Accounts::default()
        });
    close_and_settle(moved, feedback, ledger.clone());
    let running = job.start()?;
    let mut caller = Vec::new();
    for round in 0..options.caller_snapshots {
        std::thread::sleep(Duration::from_millis(20));
        let subtask = round as usize % common.parallelism;
        caller.push(running.snapshot("accounts", subtask));
    }
    let mut answers: Vec<Result<GlobalSnapshot, String>> = caller
        .iter()
        .map(|receiver| {
            receiver
                .wait(Duration::from_secs(30))
                .map_err(|error| error.to_string())
        })
        .collect();
    // The job ends by itself once the orders ended and a snapshot showed
    // the loop quiescent; the status is read just before, bounded in time.
    let mut status = running.status();
    for _ in 0..12_000 {
        if status.ended || status.loops_ended_by_snapshot > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        status = running.status();
    }
    let report = running.wait()?;
    print_report(&report);
    let from_accounts = received.lock().clone();
    println!(
        "  snapshots: {} started by the caller, {} by accounts (answered before their input ended)",
        answers.len(),
        from_accounts.len()
    );
    answers.extend(from_accounts);
    let mut checked = 0;
    for answer in &answers {
        let snapshot = match answer {
            Ok(snapshot) => snapshot,
            // A snapshot may be declined over the bound or outlive the job;
            // it is then not a snapshot, and there is nothing to total.
            Err(reason) => {
                println!("  a snapshot was not taken: {reason}");
                continue;
            }
        };
        let (total, in_flight) = total_of(snapshot, initial_total)?;
        println!("  {}: total {total} ({in_flight} in flight)", snapshot.id());
        if total != initial_total {
            return Err(ExampleError::Mismatch(format!(
                "{} holds {total}, not the initial total {initial_total}",
                snapshot.id()
            )));
        }
        checked += 1;
    }
    if checked == 0 {
        return Err(ExampleError::Mismatch("no snapshot completed".into()));
    }
    if !report.failed_checkpoints.is_empty() || report.checkpoints.is_empty() {
        return Err(ExampleError::Mismatch(format!(
            "the recovery checkpoints were disturbed: {} completed, {} failed",
            report.checkpoints.len(),
            report.failed_checkpoints.len()
        )));
    }
    let settled = ledger.committed();
    let mut orders_settled: Vec<u64> = settled
        .iter()
        .filter_map(|message| match message {
            Message::Settled { order } => Some(*order),
            _ => None,
        })
        .collect();
    orders_settled.sort_unstable();
    if orders_settled != (0..options.transfers).collect::<Vec<_>>() {
        return Err(ExampleError::Mismatch(format!(
            "{} settlements for {} transfers (the loop ended too early, or a transfer repeated)",
            orders_settled.len(),
            options.transfers
        )));
    }
    println!(
        "check: OK, all {checked} snapshots held the initial total {initial_total}, every transfer \
         settled exactly once, {} checkpoints completed beside them, and a snapshot ended the loop \
         ({} loop heads ended so, after {} snapshots showed the loop busy)",
        report.checkpoints.len(),
        status.loops_ended_by_snapshot,
        status.loop_checks_busy,
    );
    Ok(())
}
