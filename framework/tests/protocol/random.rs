//! Seeded random graphs (up to 12 nodes) and random schedules.
//!
//! Each case derives everything from one seed: the graph shape, the mode,
//! concurrency, whether snapshot tokens come back late, the coordinator's
//! interval, pause and timeout (short timeouts cause aborts), whether
//! aborts and completions reach each node late (through its own FIFO), and the
//! schedule of deliveries, sends, triggers, time and ends of input. After
//! the schedule, the world is drained with no new sends; then every
//! checkpoint must have terminated. Every completion is checked by the
//! oracle, token conservation and (where promised) zero channel state.
//!
//! A failing case prints its seed; `SNAPFLOW_SEED=<seed> cargo test -p
//! snapflow --test protocol random` replays exactly that case.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use snapflow::protocol::graph::GraphBuilder;
use snapflow::protocol::{CoordinatorConfig, SnapshotMode};

use crate::sim::{Ctx, Setup, World};

/// The families of random graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A DAG with one or two sources.
    Dag,
    /// A chain of diamonds from one source.
    Diamonds,
    /// A ring with random chords; no source.
    RingWithChords,
    /// A DAG with one to three feedback edges.
    DagWithFeedback,
    /// Every node sends to every other (the bank).
    Complete,
}

/// A random graph of `shape` with `nodes.0` to `nodes.1` nodes (at least
/// 2), and initial balances.
pub fn random_graph(
    rng: &mut StdRng,
    shape: Shape,
    nodes: (usize, usize),
) -> (GraphBuilder, Vec<i64>) {
    let count = rng.gen_range(nodes.0.max(2)..=nodes.1);
    let name = |node: usize| format!("n{node}");
    let mut edges: Vec<(usize, usize)> = Vec::new();
    let mut sources = 0;
    match shape {
        Shape::Dag | Shape::DagWithFeedback => {
            sources = rng.gen_range(1..=2.min(count - 1));
            for to in sources..count {
                edges.push((rng.gen_range(0..to), to));
                for from in 0..to {
                    if rng.gen_bool(0.15) {
                        edges.push((from, to));
                    }
                }
            }
            if shape == Shape::DagWithFeedback {
                for _ in 0..rng.gen_range(1..=3) {
                    let from = rng.gen_range(sources..count);
                    let to = rng.gen_range(sources..=from);
                    edges.push((from, to));
                }
            }
        }
        Shape::Diamonds => {
            sources = 1;
            let mut tail = 0;
            let mut next = 1;
            while next + 2 < count.max(4) {
                edges.extend([
                    (tail, next),
                    (tail, next + 1),
                    (next, next + 2),
                    (next + 1, next + 2),
                ]);
                tail = next + 2;
                next += 3;
            }
            edges.retain(|&(from, to)| from < count && to < count);
            for node in 1..count {
                if !edges.iter().any(|&(_, to)| to == node) {
                    edges.push((rng.gen_range(0..node), node));
                }
            }
        }
        Shape::RingWithChords => {
            for node in 0..count {
                edges.push((node, (node + 1) % count));
                if rng.gen_bool(0.2) {
                    edges.push((node, rng.gen_range(0..count)));
                }
            }
        }
        Shape::Complete => {
            for from in 0..count {
                for to in 0..count {
                    if from != to {
                        edges.push((from, to));
                    }
                }
            }
        }
    }
    let mut builder = GraphBuilder::new();
    for node in 0..count {
        builder = if node < sources {
            builder.source(&name(node))
        } else {
            builder.node(&name(node))
        };
    }
    for (from, to) in edges {
        builder = builder.edge(&name(from), &name(to));
    }
    let balances = (0..count).map(|_| rng.gen_range(0..=3)).collect();
    (builder, balances)
}

fn random_mode(rng: &mut StdRng, shape: Shape) -> SnapshotMode {
    let acyclic = matches!(shape, Shape::Dag | Shape::Diamonds);
    match rng.gen_range(0..4) {
        0 if acyclic => SnapshotMode::Aligned,
        0 | 1 => SnapshotMode::Cyclic,
        2 => SnapshotMode::Unaligned,
        _ => SnapshotMode::AtLeastOnce,
    }
}

/// What one case did, for the summary line.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub completed: usize,
    pub aborted: usize,
    pub recorded_messages: usize,
}

/// Runs one case from `seed`.
pub fn run_case(seed: u64, plan: &CasePlan) -> Result<Outcome, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (builder, balances) = random_graph(&mut rng, plan.shape, plan.nodes);
    let graph = builder.build().map_err(|error| error.to_string())?;
    let mode = random_mode(&mut rng, plan.shape);
    let mode = plan.mode.unwrap_or(mode);
    let steps = plan.steps;
    let mut setup = Setup::new(graph, mode, &[]);
    setup.max_concurrent = rng.gen_range(1..=3);
    setup.delay_tokens = rng.gen_bool(0.5);
    setup.delay_control = rng.gen_bool(0.5);
    let config = CoordinatorConfig {
        interval_ms: Some(rng.gen_range(3..30)),
        min_pause_ms: if rng.gen_bool(0.3) {
            rng.gen_range(1..10)
        } else {
            0
        },
        timeout_ms: if rng.gen_bool(0.3) {
            rng.gen_range(10..60)
        } else {
            1 << 40
        },
        tolerable_failures: u32::MAX,
        ..CoordinatorConfig::default()
    };
    let total = balances.iter().sum();
    let sends = rng.gen_range(plan.sends.0..plan.sends.1);
    let mut world = World::new(&setup, balances, sends, config);
    let mut ctx = Ctx::new(&setup, total);
    for _ in 0..steps {
        random_step(&mut rng, &mut world, &mut ctx, true)?;
    }
    let mut drain_steps = 0;
    while !world.is_quiet(&ctx) {
        random_step(&mut rng, &mut world, &mut ctx, false)?;
        drain_steps += 1;
        if drain_steps > 1_000_000 {
            return Err("the world never became quiet".into());
        }
    }
    world.check_terminated()?;
    Ok(Outcome {
        completed: ctx.stats.completed,
        aborted: ctx.stats.aborted,
        recorded_messages: ctx.stats.recorded_messages,
    })
}

/// One random step; with `open` false only deliveries, triggers and token
/// returns (the drain phase).
fn random_step(
    rng: &mut StdRng,
    world: &mut World,
    ctx: &mut Ctx<'_>,
    open: bool,
) -> Result<(), String> {
    let choice = rng.gen_range(0..100);
    if open && choice < 10 {
        let now_ms = ctx.now_ms + rng.gen_range(1..6);
        return world.advance_to(ctx, now_ms);
    }
    if open && choice < 25 && world.sends_left > 0 {
        let edges = ctx.setup.graph.edges();
        let edge = rng.gen_range(0..edges.len().max(1));
        if edge < edges.len() && world.balances[edges[edge].from] > 0 && !world.output_ended[edge] {
            world.sends_left -= 1;
            let amount = rng.gen_range(1..=world.balances[edges[edge].from]);
            world.send(ctx, edge, amount);
        }
        return Ok(());
    }
    if open && choice == 25 && rng.gen_bool(0.2) {
        let sources = ctx.setup.graph.sources();
        if !sources.is_empty() {
            let node = sources[rng.gen_range(0..sources.len())];
            world.end_outputs(ctx, node);
        }
        return Ok(());
    }
    if choice < 32 && !ctx.tokens.is_empty() {
        let index = rng.gen_range(0..ctx.tokens.len());
        return world.return_token(ctx, index);
    }
    if choice < 36 {
        let waiting: Vec<usize> = (0..world.control.len())
            .filter(|&node| !world.control[node].is_empty())
            .collect();
        if !waiting.is_empty() {
            return world.deliver_control(ctx, waiting[rng.gen_range(0..waiting.len())]);
        }
    }
    if choice < 40 && !world.triggers.is_empty() {
        let index = rng.gen_range(0..world.triggers.len());
        return world.deliver_trigger(ctx, index);
    }
    let busy: Vec<usize> = (0..world.channels.len())
        .filter(|&edge| !world.channels[edge].is_empty())
        .collect();
    if !busy.is_empty() {
        return world.deliver(ctx, busy[rng.gen_range(0..busy.len())]);
    }
    if !world.triggers.is_empty() {
        return world.deliver_trigger(ctx, 0);
    }
    if !ctx.tokens.is_empty() {
        return world.return_token(ctx, 0);
    }
    if let Some(node) = (0..world.control.len()).find(|&node| !world.control[node].is_empty()) {
        return world.deliver_control(ctx, node);
    }
    Ok(())
}

/// What kind of cases to run.
#[derive(Debug, Clone)]
pub struct CasePlan {
    pub shape: Shape,
    /// The least and most nodes.
    pub nodes: (usize, usize),
    pub steps: usize,
    /// The range of the send budget.
    pub sends: (u32, u32),
    /// A fixed mode, or `None` for a random one.
    pub mode: Option<SnapshotMode>,
}

impl CasePlan {
    pub fn new(shape: Shape) -> CasePlan {
        CasePlan {
            shape,
            nodes: (2, 12),
            steps: 500,
            sends: (5, 80),
            mode: None,
        }
    }
}

/// Runs `cases` cases from consecutive seeds starting at `base` (or only
/// the case in `SNAPFLOW_SEED`), and prints a summary.
pub fn check_many(label: &str, plan: &CasePlan, cases: u64, base: u64) -> Outcome {
    let seeds: Vec<u64> = match std::env::var("SNAPFLOW_SEED") {
        Ok(value) => vec![value.parse().expect("SNAPFLOW_SEED is a u64")],
        Err(_) => (base..base + cases).collect(),
    };
    let mut total = Outcome::default();
    for seed in &seeds {
        match run_case(*seed, plan) {
            Ok(outcome) => {
                total.completed += outcome.completed;
                total.aborted += outcome.aborted;
                total.recorded_messages += outcome.recorded_messages;
            }
            Err(error) => panic!(
                "{label}: case with seed {seed} failed: {error}\nreplay: SNAPFLOW_SEED={seed} \
                 cargo test -p snapflow --test protocol {label}"
            ),
        }
    }
    println!(
        "{label}: {} cases, {} checkpoints completed and checked, {} aborted, {} channel messages recorded",
        seeds.len(),
        total.completed,
        total.aborted,
        total.recorded_messages
    );
    total
}

fn check(label: &str, shape: Shape, cases: u64, base: u64) {
    let outcome = check_many(label, &CasePlan::new(shape), cases, base);
    assert!(outcome.completed > 0, "no checkpoint completed");
}

#[test]
fn random_dags() {
    check("random_dags", Shape::Dag, 3_000, 1_000_000);
}
#[test]
fn random_diamonds() {
    check("random_diamonds", Shape::Diamonds, 2_000, 2_000_000);
}
#[test]
fn random_rings_with_chords() {
    check(
        "random_rings_with_chords",
        Shape::RingWithChords,
        3_000,
        3_000_000,
    );
}
#[test]
fn random_dags_with_feedback() {
    check(
        "random_dags_with_feedback",
        Shape::DagWithFeedback,
        2_000,
        4_000_000,
    );
}
