//! Runtime global snapshots checked channel by channel (issue 15): a job
//! whose operators count what they sent and received on every channel, and
//! a caller that asks for snapshots without pause, started at every subtask
//! of every operator in turn. Every completed snapshot must satisfy, on
//! each channel, received + recorded in flight = sent, with "sent" and
//! "received" read from the snapshot's own operator states and subtask
//! activity at the local snapshot points. At parallelism 1, 2 and 3.
//!
//! How the channels are known: the source's subtask `i` emits the ids of
//! its own share of `0..RECORDS` (`split_range`, as `VecSourceFactory`
//! splits them), and `relay` is keyed by that origin subtask, so every
//! record from source subtask `i` takes the one channel to the owner of key
//! `i`, and `relay`'s keyed count for key `i` is what that channel
//! delivered. `relay` forwards each record, tagged with its own key, keyed
//! by `id % KEYS` to `count`. `relay`'s state per key `o` counts what it
//! sent per key `k` of `count`, and `count`'s state per key `k` counts what
//! it received per tag `o`; the channel from the owner of `o` to the owner
//! of `k` (the router's key groups) carried exactly those records.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use snapflow::job::snapshots::{GlobalSnapshot, SnapshotError};
use snapflow::job::{Job, JobConfig};
use snapflow::keyed::{key_group_of, key_hash, subtask_for_key_group};
use snapflow::protocol::SnapshotId;
use snapflow::sink::CollectHandle;
use snapflow::source::split_range;
use snapflow::Snapshot;
use snapflow_tests::pipeline::{PacedSourceFactory, Pacing};

const RECORDS: u64 = 4_000;
const KEYS: u64 = 11;

/// `relay`'s state per origin subtask: how many records came from it, and
/// per key of `count` how many it sent on.
#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Relayed {
    received: u64,
    sent_per_key: BTreeMap<u64, u64>,
}

/// `count`'s state per key: how many records of that key came from each
/// relay subtask (by the relay's own origin key).
#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
struct Counted {
    from_origin: BTreeMap<u64, u64>,
}

/// The source subtask (of `parallelism`) whose share holds `id`.
fn origin(id: u64, parallelism: usize) -> u64 {
    (0..parallelism)
        .find(|&subtask| {
            split_range(0..RECORDS, subtask, parallelism)
                .expect("a valid split")
                .contains(&id)
        })
        .expect("every id is in a share") as u64
}

fn run(parallelism: usize) {
    let config = JobConfig {
        checkpoint_interval_ms: Some(5),
        default_parallelism: parallelism,
        ..JobConfig::default()
    };
    let job = Job::new("snapshot-channels", config);
    let output = CollectHandle::new();
    job.source(
        "ids",
        PacedSourceFactory::new(
            RECORDS,
            Pacing {
                records_per_read: 8,
            },
        ),
    )
    .key_by(move |id: &u64| origin(*id, parallelism))
    .process("relay", |key: &u64, relayed: &mut Relayed, id: u64, out| {
        relayed.received += 1;
        *relayed.sent_per_key.entry(id % KEYS).or_default() += 1;
        out.emit((*key, id));
        Ok(())
    })
    .key_by(|(_, id): &(u64, u64)| id % KEYS)
    .process(
        "count",
        |_key: &u64, counted: &mut Counted, (from, id): (u64, u64), out| {
            *counted.from_origin.entry(from).or_default() += 1;
            out.emit(id);
            Ok(())
        },
    )
    .sink("out", output.clone());
    let running = job.start().expect("the job starts");
    let operators = ["ids", "relay", "count"];
    let mut answers = Vec::new();
    while !running.status().ended && answers.len() < 1_000 {
        let index = answers.len();
        let operator = operators[index % operators.len()];
        let subtask = (index / operators.len()) % parallelism;
        let answer = running
            .snapshot(operator, subtask)
            .wait(Duration::from_secs(30));
        // Until the job has loaded its first checkpoint it is not running
        // yet: those answers come at once, and counted they once used up
        // all 1,000 tries on a loaded machine before any snapshot ran.
        if matches!(answer, Err(SnapshotError::NotRunning { .. })) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        answers.push(answer);
    }
    running.wait().expect("the job finishes");
    let mut ids = output.committed();
    ids.sort_unstable();
    assert_eq!(ids, (0..RECORDS).collect::<Vec<_>>(), "exactly-once output");
    let (mut checked, mut with_records_in_flight) = (0, 0);
    for answer in answers {
        match answer {
            Ok(snapshot) => {
                check(&snapshot, parallelism);
                checked += 1;
                if snapshot
                    .channels()
                    .iter()
                    .any(|channel| channel.records_in_flight > 0)
                {
                    with_records_in_flight += 1;
                }
            }
            // The end of the job ends the last ones; nothing else may go
            // wrong.
            Err(error) => assert!(
                matches!(
                    error,
                    SnapshotError::NotRunning { .. } | SnapshotError::JobEnded
                ),
                "{error}"
            ),
        }
    }
    assert!(checked > 0, "some snapshot completed");
    println!(
        "parallelism {parallelism}: {checked} snapshots checked channel by channel, \
         {with_records_in_flight} of them with records in flight"
    );
}

/// Records in flight recorded on each channel from `from` to `to`, by
/// (sending subtask, receiving subtask).
fn in_flight(snapshot: &GlobalSnapshot, from: &str, to: &str) -> HashMap<(u32, u32), u64> {
    snapshot
        .channels()
        .iter()
        .filter(|channel| channel.from.operator == from && channel.to.operator == to)
        .map(|channel| {
            (
                (channel.from.subtask, channel.to.subtask),
                channel.records_in_flight,
            )
        })
        .collect()
}

/// The subtask (of `parallelism`) that owns `key`, as the router and the
/// keyed state place it.
fn owner(snapshot: &GlobalSnapshot, key: u64, parallelism: usize) -> u32 {
    let max_parallelism = snapshot.view().metadata().key_groups.max_parallelism;
    let group = key_group_of(key_hash(&key), max_parallelism).expect("a valid layout");
    subtask_for_key_group(max_parallelism, parallelism as u32, group).expect("a valid layout")
}

/// Every channel of `snapshot`: received + recorded in flight = sent.
fn check(snapshot: &GlobalSnapshot, parallelism: usize) {
    let id = snapshot.id();
    let relayed: HashMap<u64, Relayed> = snapshot
        .view()
        .keyed_state("relay")
        .expect("relay's keyed state decodes");
    let counted: HashMap<u64, Counted> = snapshot
        .view()
        .keyed_state("count")
        .expect("count's keyed state decodes");
    let channels = parallelism * parallelism;
    // ids -> relay: source subtask i sends all its records (key i) to the
    // owner of key i and nothing to any other relay subtask.
    let flight = in_flight(snapshot, "ids", "relay");
    assert_eq!(flight.len(), channels, "{id}: every channel listed");
    for source in 0..parallelism as u32 {
        let sent_all = snapshot
            .subtask("ids", source)
            .expect("every subtask has a part")
            .records_out;
        let received_all = relayed
            .get(&u64::from(source))
            .map_or(0, |state| state.received);
        let target = owner(snapshot, u64::from(source), parallelism);
        for relay in 0..parallelism as u32 {
            let (sent, received) = if relay == target {
                (sent_all, received_all)
            } else {
                (0, 0)
            };
            balance(
                id,
                ("ids", source),
                ("relay", relay),
                sent,
                received,
                flight[&(source, relay)],
            );
        }
    }
    // relay -> count: relay's key o lives on relay subtask owner(o), count's
    // key k on count subtask owner(k); the channel between them carried
    // every record relay's key o sent with key k.
    let flight = in_flight(snapshot, "relay", "count");
    assert_eq!(flight.len(), channels, "{id}: every channel listed");
    let mut sent: HashMap<(u32, u32), u64> = HashMap::new();
    let mut received: HashMap<(u32, u32), u64> = HashMap::new();
    for (origin_key, state) in &relayed {
        let relay = owner(snapshot, *origin_key, parallelism);
        for (key, records) in &state.sent_per_key {
            *sent
                .entry((relay, owner(snapshot, *key, parallelism)))
                .or_default() += records;
        }
    }
    for (key, state) in &counted {
        let count = owner(snapshot, *key, parallelism);
        for (origin_key, records) in &state.from_origin {
            let relay = owner(snapshot, *origin_key, parallelism);
            *received.entry((relay, count)).or_default() += records;
        }
    }
    for relay in 0..parallelism as u32 {
        for count in 0..parallelism as u32 {
            let channel = (relay, count);
            balance(
                id,
                ("relay", relay),
                ("count", count),
                sent.get(&channel).copied().unwrap_or(0),
                received.get(&channel).copied().unwrap_or(0),
                flight[&channel],
            );
        }
    }
}

/// One channel's balance: what its receiver processed plus what the
/// snapshot recorded in flight on it is what its sender sent.
fn balance(
    id: SnapshotId,
    from: (&str, u32),
    to: (&str, u32),
    sent: u64,
    received: u64,
    in_flight: u64,
) {
    assert_eq!(
        received + in_flight,
        sent,
        "{id}: {}/{} -> {}/{}: received {received} + in flight {in_flight} != sent {sent}",
        from.0,
        from.1,
        to.0,
        to.1
    );
}

#[test]
fn every_channel_of_every_snapshot_balances_parallelism_1() {
    run(1);
}

#[test]
fn every_channel_of_every_snapshot_balances_parallelism_2() {
    run(2);
}

#[test]
fn every_channel_of_every_snapshot_balances_parallelism_3() {
    run(3);
}
