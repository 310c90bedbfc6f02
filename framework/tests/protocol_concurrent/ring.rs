//! The ring case of issue 15, step by step, with both snapshots written out.
//!
//! Three processes A, B, C in a ring linked both ways (every pair has a
//! channel in each direction), each holding 10. A and C start snapshots at
//! the same moment, before any marker moves. B then receives C's marker
//! first and A's second, while C receives A's marker before any marker of
//! its own snapshot comes back, and A receives C's marker before its own
//! comes back. The coordinated `NodeMachine` drops or declines one of the
//! two here whatever the numbering; the concurrent machine completes both,
//! each with its own local and channel states.

use snapflow::protocol::graph::GraphBuilder;
use snapflow::protocol::oracle::TraceEvent;
use snapflow::protocol::SnapshotId;

use crate::sim::{label, Ctx, Finished, Setup, World};

/// One scripted step; nodes are named "a", "b", "c".
#[derive(Debug, Clone, Copy)]
enum Step {
    Send(&'static str, &'static str, i64),
    Start(&'static str),
    Deliver(&'static str, &'static str),
}

use Step::{Deliver, Send, Start};

const A_SNAPSHOT: SnapshotId = SnapshotId {
    initiator: 0,
    sequence: 0,
};
const C_SNAPSHOT: SnapshotId = SnapshotId {
    initiator: 2,
    sequence: 0,
};

fn bidirectional_ring() -> Setup {
    let graph = GraphBuilder::new()
        .node("a")
        .node("b")
        .node("c")
        .edge("a", "b")
        .edge("b", "a")
        .edge("b", "c")
        .edge("c", "b")
        .edge("c", "a")
        .edge("a", "c")
        .build()
        .expect("valid graph");
    Setup::new(graph, 2)
}

/// The schedule. The comments say what each step does under Chandy-Lamport.
const SCHEDULE: [Step; 22] = [
    Send("a", "b", 2), // A: 8.
    Send("b", "a", 5), // B: 5.
    Send("c", "b", 3), // C: 7.
    Start("a"),        // A records 8 for A's snapshot; its markers follow the 2 to B.
    Start("c"),        // C records 7 for C's; its marker follows the 3 to B.
    Deliver("c", "b"), // B gets the 3: B = 8.
    Deliver("c", "b"), // C's marker, B's first: B records 8 for C's, records A->B for it.
    Deliver("a", "b"), // The 2, recorded for C's on A->B: B = 10.
    Deliver("a", "b"), // A's marker, B's second: B records 10 for A's, records C->B for it.
    Deliver("a", "c"), // A's marker, C's first incoming one: C records 7 for A's.
    Send("a", "c", 1), // A, after its own snapshot point: A = 7.
    Deliver("b", "a"), // The 5, recorded for A's on B->A: A = 12.
    Deliver("b", "a"), // C's marker (via B), A's first: A records 12 for C's.
    Deliver("c", "a"), // C's marker: C's done at A, both inputs empty.
    Deliver("c", "a"), // A's marker (via C): A's waits for B->A only.
    Deliver("b", "a"), // A's marker (via B): A's done at A, B->A holds the 5.
    Deliver("b", "c"), // C's marker (via B): C's waits for A->C at C.
    Deliver("b", "c"), // A's marker (via B): A's done at C, both inputs empty.
    Deliver("a", "c"), // The 1, recorded for C's on A->C: C = 8.
    Deliver("a", "c"), // C's marker (via A): C's done at C, A->C holds the 1.
    Deliver("c", "b"), // A's marker (via C): A's done at B, the last part: A's completes.
    Deliver("a", "b"), // C's marker (via A): C's done at B, the last part: C's completes.
];

/// The expected snapshot: balances of A, B, C and the recorded money per
/// named channel (channels not listed recorded nothing).
fn expected(
    setup: &Setup,
    id: SnapshotId,
    balances: [i64; 3],
    channels: &[(&str, &str, &[i64])],
) -> Finished {
    let mut recorded = vec![Vec::new(); setup.graph.edges().len()];
    for &(from, to, money) in channels {
        recorded[setup.edge(from, to)] = money.to_vec();
    }
    Finished {
        id,
        balances: balances.to_vec(),
        channels: recorded,
        recorded: Default::default(),
    }
}

/// Runs the schedule and returns the finished snapshots (without their
/// message ids, which the oracle already checked) and the world.
fn run(setup: &Setup) -> (Vec<Finished>, World, Vec<TraceEvent>) {
    let mut world = World::new(setup, vec![10, 10, 10], 0, vec![1, 0, 1]);
    let mut ctx = Ctx::new(setup, 30);
    ctx.keep_finished = true;
    for (index, step) in SCHEDULE.iter().enumerate() {
        let outcome = match *step {
            Send(from, to, amount) => {
                world.send(&mut ctx, setup.edge(from, to), amount);
                Ok(())
            }
            Start(node) => world.start(&mut ctx, setup.node(node)).map(|_| ()),
            Deliver(from, to) => world.deliver(&mut ctx, setup.edge(from, to)),
        };
        if let Err(error) = outcome {
            panic!("step {index} ({step:?}): {error}");
        }
    }
    world.check_terminated(false).expect("both snapshots done");
    world.verify_all(&ctx).expect("the oracle accepts both");
    let finished = ctx
        .finished
        .iter()
        .map(|done| Finished {
            recorded: Default::default(),
            ..done.clone()
        })
        .collect();
    (finished, world, ctx.trace.events)
}

/// The order in which `node` took its local snapshots.
fn snapshot_order(events: &[TraceEvent], node: usize) -> Vec<u64> {
    events
        .iter()
        .filter_map(|event| match *event {
            TraceEvent::Snapshot {
                process,
                checkpoint,
            } if process == node => Some(checkpoint.0),
            _ => None,
        })
        .collect()
}

#[test]
fn a_and_c_start_at_once_and_b_sees_c_first_both_complete() {
    let setup = bidirectional_ring();
    let (finished, world, events) = run(&setup);
    let a_snapshot = expected(&setup, A_SNAPSHOT, [8, 10, 7], &[("b", "a", &[5])]);
    let c_snapshot = expected(
        &setup,
        C_SNAPSHOT,
        [12, 8, 7],
        &[("a", "b", &[2]), ("a", "c", &[1])],
    );
    assert_eq!(finished, vec![a_snapshot, c_snapshot]);
    assert_eq!(world.completed, vec![A_SNAPSHOT, C_SNAPSHOT]);
    let (a, c) = (label(A_SNAPSHOT).0, label(C_SNAPSHOT).0);
    assert_eq!(snapshot_order(&events, setup.node("b")), vec![c, a]);
    assert_eq!(snapshot_order(&events, setup.node("c")), vec![c, a]);
    assert_eq!(snapshot_order(&events, setup.node("a")), vec![a, c]);
    assert_eq!(world.balances, vec![12, 10, 8]);
}
