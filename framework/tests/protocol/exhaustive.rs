//! Every delivery interleaving of small graphs, explored depth first.
//!
//! The explorer enumerates every enabled step in every reachable state:
//! deliver the head of any channel, deliver a pending trigger, send one
//! token on any output of a node that has one (at most `sends` in total:
//! 4, or 3 on the fully connected graph, and at most 3 data messages in
//! flight), ask for the next checkpoint (2 in total), and in some runs abort
//! everything once.
//! Snapshot tokens are handed back at once. States are deduplicated by a
//! 64-bit hash of the whole world (machines, channels, balances, collected
//! parts and the message ids inside every node's cut), so two histories are
//! merged only when every future check would see the same thing. A hash
//! collision could hide a state; at these sizes (well under 10^7 states) the
//! chance is below 10^-5.

use std::collections::HashSet;

use snapflow::protocol::graph::GraphBuilder;
use snapflow::protocol::{CoordinatorConfig, SnapshotMode};

use crate::sim::{Ctx, Setup, World};

const CHECKPOINTS: u32 = 2;
const MAX_DATA_IN_FLIGHT: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Step {
    Deliver(usize),
    Trigger(usize),
    Send(usize),
    Request,
    AbortAll,
}

/// How far the explorer goes beyond the fixed bounds.
struct Limits {
    /// How many times the driver may abort all checkpoints in flight.
    aborts: u32,
}

struct Explorer {
    limits: Limits,
    visited: HashSet<u64>,
    path: Vec<Step>,
    terminals: usize,
    completed: usize,
    recorded: usize,
}

impl Explorer {
    fn steps(world: &World, ctx: &Ctx<'_>, limits: &Limits) -> Vec<Step> {
        let mut steps = Vec::new();
        for (edge, channel) in world.channels.iter().enumerate() {
            if !channel.is_empty() {
                steps.push(Step::Deliver(edge));
            }
        }
        steps.extend((0..world.triggers.len()).map(Step::Trigger));
        if world.sends_left > 0 && world.data_in_flight() < MAX_DATA_IN_FLIGHT {
            for (edge, ends) in ctx.setup.graph.edges().iter().enumerate() {
                if world.balances[ends.from] > 0 && !world.output_ended[edge] {
                    steps.push(Step::Send(edge));
                }
            }
        }
        let in_flight = world.coordinator.in_flight().count();
        if world.requested < CHECKPOINTS && in_flight < ctx.setup.max_concurrent {
            steps.push(Step::Request);
        }
        if world.driver_aborts < limits.aborts && in_flight > 0 {
            steps.push(Step::AbortAll);
        }
        steps
    }

    fn apply(world: &mut World, ctx: &mut Ctx<'_>, step: Step) -> Result<(), String> {
        match step {
            Step::Deliver(edge) => world.deliver(ctx, edge),
            Step::Trigger(index) => world.deliver_trigger(ctx, index),
            Step::Send(edge) => {
                world.sends_left -= 1;
                world.send(ctx, edge, 1);
                Ok(())
            }
            Step::Request => world.request(ctx),
            Step::AbortAll => world.abort_all(ctx),
        }
    }

    fn explore(&mut self, world: &World, ctx: &mut Ctx<'_>) {
        let steps = Explorer::steps(world, ctx, &self.limits);
        if steps.is_empty() {
            self.terminals += 1;
            if let Err(error) = world.check_terminated() {
                panic!("{error}\npath: {:?}", self.path);
            }
            assert_eq!(world.requested, CHECKPOINTS, "path: {:?}", self.path);
            return;
        }
        for step in steps {
            let mark = ctx.trace.events.len();
            let completed_before = ctx.stats.completed;
            let mut next = world.clone();
            self.path.push(step);
            if let Err(error) = Explorer::apply(&mut next, ctx, step) {
                panic!("{error}\npath: {:?}", self.path);
            }
            assert!(!next.failed, "the job failed; path: {:?}", self.path);
            self.completed += ctx.stats.completed - completed_before;
            if self.visited.insert(next.digest()) {
                self.explore(&next, ctx);
            }
            self.path.pop();
            ctx.trace.events.truncate(mark);
        }
    }
}

struct Case {
    name: &'static str,
    graph: GraphBuilder,
    balances: Vec<i64>,
    sends: u32,
}

fn check(case: Case, mode: SnapshotMode, max_concurrent: usize, aborts: u32) -> usize {
    let graph = case.graph.build().expect("valid graph");
    let mut setup = Setup::new(graph, mode, &[]);
    setup.max_concurrent = max_concurrent;
    let total = case.balances.iter().sum();
    let config = CoordinatorConfig::default();
    let world = World::new(&setup, case.balances, case.sends, config);
    let mut ctx = Ctx::new(&setup, total);
    let mut explorer = Explorer {
        limits: Limits { aborts },
        visited: HashSet::new(),
        path: Vec::new(),
        terminals: 0,
        completed: 0,
        recorded: 0,
    };
    explorer.visited.insert(world.digest());
    explorer.explore(&world, &mut ctx);
    explorer.recorded = ctx.stats.recorded_messages;
    println!(
        "exhaustive {:<14} {:<12} concurrent={} aborts={} states={:>8} terminal={:>7} completions checked={:>8} \
         recorded messages={}",
        case.name,
        format!("{mode:?}"),
        max_concurrent,
        aborts,
        explorer.visited.len(),
        explorer.terminals,
        explorer.completed,
        explorer.recorded,
    );
    assert!(explorer.completed > 0, "no checkpoint ever completed");
    explorer.visited.len()
}

fn two_cycle() -> Case {
    let graph = GraphBuilder::new()
        .node("a")
        .node("b")
        .edge("a", "b")
        .edge("b", "a");
    Case {
        name: "2-cycle",
        graph,
        balances: vec![2, 1],
        sends: 4,
    }
}

fn ring3() -> Case {
    let graph = GraphBuilder::new()
        .node("a")
        .node("b")
        .node("c")
        .edge("a", "b")
        .edge("b", "c")
        .edge("c", "a");
    Case {
        name: "3-ring",
        graph,
        balances: vec![1, 1, 1],
        sends: 4,
    }
}

fn diamond() -> Case {
    let graph = GraphBuilder::new()
        .source("s")
        .node("a")
        .node("b")
        .node("t")
        .edge("s", "a")
        .edge("s", "b")
        .edge("a", "t")
        .edge("b", "t");
    Case {
        name: "diamond",
        graph,
        balances: vec![3, 0, 0, 0],
        sends: 4,
    }
}

fn full3() -> Case {
    let mut graph = GraphBuilder::new().node("a").node("b").node("c");
    for from in ["a", "b", "c"] {
        for to in ["a", "b", "c"] {
            if from != to {
                graph = graph.edge(from, to);
            }
        }
    }
    Case {
        name: "3-full",
        graph,
        balances: vec![1, 1, 1],
        sends: 3,
    }
}

fn dag_with_feedback() -> Case {
    let graph = GraphBuilder::new()
        .source("s")
        .node("a")
        .node("b")
        .node("t")
        .edge("s", "a")
        .edge("a", "b")
        .edge("b", "a")
        .edge("b", "t");
    Case {
        name: "dag+feedback",
        graph,
        balances: vec![2, 1, 0, 0],
        sends: 4,
    }
}

/// One node sending to itself: its only channel is its own back edge.
fn self_loop() -> Case {
    let graph = GraphBuilder::new().node("a").edge("a", "a");
    Case {
        name: "1-self-loop",
        graph,
        balances: vec![2],
        sends: 4,
    }
}

/// The 2-cycle with a self-loop on `on`. On `a`, the initiator, it is P1's
/// C11 in the seed's section 9 example; on `b` it is a back edge next to
/// `b`'s forward input, which the cyclic mode aligns while it records the
/// self-loop.
fn two_cycle_with_self_loop(on: &str) -> Case {
    let graph = GraphBuilder::new()
        .node("a")
        .node("b")
        .edge("a", "b")
        .edge("b", "a")
        .edge(on, on);
    Case {
        name: if on == "a" {
            "2-cycle+self-a"
        } else {
            "2-cycle+self-b"
        },
        graph,
        balances: vec![2, 1],
        sends: 4,
    }
}

#[test]
fn two_cycle_unaligned() {
    check(two_cycle(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn two_cycle_cyclic() {
    check(two_cycle(), SnapshotMode::Cyclic, 1, 0);
}
#[test]
fn two_cycle_cyclic_concurrent() {
    check(two_cycle(), SnapshotMode::Cyclic, 2, 0);
}
#[test]
fn two_cycle_at_least_once() {
    check(two_cycle(), SnapshotMode::AtLeastOnce, 1, 0);
}
#[test]
fn ring3_unaligned() {
    check(ring3(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn ring3_cyclic() {
    check(ring3(), SnapshotMode::Cyclic, 1, 0);
}
#[test]
fn diamond_aligned() {
    check(diamond(), SnapshotMode::Aligned, 1, 0);
}
#[test]
fn diamond_aligned_concurrent() {
    check(diamond(), SnapshotMode::Aligned, 2, 0);
}
#[test]
fn diamond_unaligned() {
    check(diamond(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn diamond_at_least_once() {
    check(diamond(), SnapshotMode::AtLeastOnce, 1, 0);
}
#[test]
fn full3_unaligned() {
    check(full3(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn full3_cyclic() {
    check(full3(), SnapshotMode::Cyclic, 1, 0);
}
#[test]
fn dag_with_feedback_cyclic() {
    check(dag_with_feedback(), SnapshotMode::Cyclic, 1, 0);
}
#[test]
fn dag_with_feedback_unaligned() {
    check(dag_with_feedback(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn dag_with_feedback_concurrent() {
    check(dag_with_feedback(), SnapshotMode::Cyclic, 2, 0);
}
#[test]
fn two_cycle_unaligned_with_abort() {
    check(two_cycle(), SnapshotMode::Unaligned, 1, 1);
}
#[test]
fn diamond_aligned_concurrent_with_abort() {
    check(diamond(), SnapshotMode::Aligned, 2, 1);
}
#[test]
fn ring3_cyclic_concurrent_with_abort() {
    check(ring3(), SnapshotMode::Cyclic, 2, 1);
}
#[test]
fn dag_with_feedback_at_least_once() {
    check(dag_with_feedback(), SnapshotMode::AtLeastOnce, 1, 0);
}
#[test]
fn self_loop_unaligned() {
    check(self_loop(), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn self_loop_cyclic_concurrent_with_abort() {
    check(self_loop(), SnapshotMode::Cyclic, 2, 1);
}
#[test]
fn two_cycle_with_self_loop_on_the_initiator_unaligned() {
    check(two_cycle_with_self_loop("a"), SnapshotMode::Unaligned, 1, 0);
}
#[test]
fn two_cycle_with_self_loop_on_the_other_node_cyclic() {
    check(two_cycle_with_self_loop("b"), SnapshotMode::Cyclic, 1, 0);
}
#[test]
fn two_cycle_with_self_loop_on_the_other_node_cyclic_concurrent() {
    check(two_cycle_with_self_loop("b"), SnapshotMode::Cyclic, 2, 0);
}
#[test]
fn two_cycle_with_self_loop_on_the_other_node_at_least_once() {
    check(
        two_cycle_with_self_loop("b"),
        SnapshotMode::AtLeastOnce,
        1,
        0,
    );
}
