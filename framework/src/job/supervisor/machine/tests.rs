//! Seeded random schedules of events against the machine alone, with a
//! driven clock, checked after every command against the invariants of
//! `docs/design/supervisor-machine.md`. The world around the machine plays
//! the subtasks (acks in any order, declines, duplicates, failures, late
//! messages of old generations), the writer (persists that complete, fail
//! or are subsumed, in any order) and the user (savepoints, stops).
//!
//! `SNAPFLOW_SEED` replays one schedule; `SNAPFLOW_CASES` sets how many run
//! (10 000 by default).

use std::collections::BTreeSet;

use super::*;
use crate::keyed::test_support::Rng;
use crate::protocol::DeclineReason;

/// A part names who acked what, so a persist shows where its parts came
/// from: (node, checkpoint, generation).
type Part = (usize, u64, u64);

/// The schedules, one per seed; a failing one names its seed.
#[test]
fn random_schedules_keep_the_invariants() {
    if let Ok(seed) = std::env::var("SNAPFLOW_SEED") {
        let seed = seed.parse().expect("SNAPFLOW_SEED must be a u64");
        let _ = check(seed);
        return;
    }
    let cases: u64 = std::env::var("SNAPFLOW_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(10_000);
    let base: u64 = rand::random();
    let mut seen = Seen::default();
    for case in 0..cases {
        let seed = base.wrapping_add(case);
        match std::panic::catch_unwind(|| check(seed)) {
            Ok(one) => seen.add(&one),
            Err(_) => panic!("schedule {case} failed; replay with SNAPFLOW_SEED={seed}"),
        }
    }
    eprintln!("{cases} schedules reached {seen:?}");
    // The schedules must reach what the invariants are about, or they
    // prove little.
    if cases >= 1_000 {
        assert!(seen.durable > 0 && seen.completions > 0, "{seen:?}");
        assert!(seen.restarts > 0 && seen.late > 0, "{seen:?}");
        assert!(seen.savepoints > 0 && seen.persist_failures > 0, "{seen:?}");
        assert!(seen.finished > 0 && seen.not_retryable > 0, "{seen:?}");
    }
}

/// What the schedules reached, summed.
#[derive(Debug, Default)]
struct Seen {
    durable: u64,
    completions: u64,
    restarts: u64,
    late: u64,
    savepoints: u64,
    persist_failures: u64,
    finished: u64,
    not_retryable: u64,
}

impl Seen {
    fn add(&mut self, other: &Seen) {
        self.durable += other.durable;
        self.completions += other.completions;
        self.restarts += other.restarts;
        self.late += other.late;
        self.savepoints += other.savepoints;
        self.persist_failures += other.persist_failures;
        self.finished += other.finished;
        self.not_retryable += other.not_retryable;
    }
}

#[test]
fn a_fixed_seed_replays() {
    let _ = check(1);
}

#[test]
fn a_busy_seed_replays() {
    let _ = check(0x5eed);
}

/// Events and commands are plain data: they go through postcard and come
/// back equal.
#[test]
fn events_and_commands_cross_a_process_boundary() {
    let event: Event<Part> = Event::Ack {
        node: 2,
        generation: Generation(3),
        checkpoint: CheckpointId(7),
        part: (2, 7, 3),
    };
    let command: Command<Part> = Command::Send {
        node: 1,
        message: ToSubtask::Trigger(CheckpointId(8), CheckpointKind::Savepoint),
    };
    let bytes = postcard::to_allocvec(&event).expect("encodes");
    assert_eq!(postcard::from_bytes::<Event<Part>>(&bytes), Ok(event));
    let bytes = postcard::to_allocvec(&command).expect("encodes");
    assert_eq!(postcard::from_bytes::<Command<Part>>(&bytes), Ok(command));
}

/// Runs one schedule of `seed`; what it reached.
fn check(seed: u64) -> Seen {
    let mut world = World::new(seed);
    for _ in 0..120 {
        if world.ended {
            // Nothing more may come out of a machine that ended the job.
            world.step();
            assert!(world.machine.poll_command().is_none(), "seed {seed}");
            break;
        }
        world.step();
    }
    world.seen
}

/// The machine and everything around it, with the facts the invariants
/// are checked against.
struct World {
    rng: Rng,
    seed: u64,
    machine: SupervisorMachine<Part>,
    now_ms: u64,
    region_of: Vec<usize>,
    /// Per region: running, and its current generation.
    running: Vec<bool>,
    generation: Vec<u64>,
    next_generation: u64,
    /// Regions stopped and waiting for their restart.
    stopped: Vec<usize>,
    /// Acks owed: (node, checkpoint, generation).
    owed: Vec<Part>,
    /// Completions to commit: (node, checkpoint, generation).
    completions: Vec<Part>,
    /// Events of generations that are gone, delivered late.
    late: Vec<Event<Part>>,
    /// Persists handed over and not answered: (epoch, checkpoint).
    persisting: Vec<(u64, u64)>,
    /// Checkpoints answered as durable.
    durable: BTreeSet<u64>,
    /// The newest checkpoint triggered.
    highest_triggered: u64,
    /// The kind of each triggered checkpoint.
    kinds: Vec<(u64, CheckpointKind)>,
    /// Per node: inputs ended in its current generation, newest commit.
    ended_nodes: Vec<bool>,
    committed: Vec<Option<u64>>,
    /// A non-retryable failure of a current generation was just delivered.
    fatal: bool,
    stop_requested: bool,
    /// The id floor handed to the last region start.
    floor: u64,
    ended: bool,
    seen: Seen,
}

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed);
        let nodes = 1 + rng.below(5) as usize;
        let regions = 1 + rng.below(nodes.min(3) as u64) as usize;
        let region_of: Vec<usize> = (0..nodes)
            .map(|node| {
                if node < regions {
                    node
                } else {
                    rng.below(regions as u64) as usize
                }
            })
            .collect();
        let mut initiators: Vec<usize> = (1..nodes).filter(|_| rng.below(3) == 0).collect();
        initiators.insert(0, 0);
        let config = MachineConfig {
            interval_ms: (rng.below(10) != 0).then(|| 10 + rng.below(90)),
            min_pause_ms: if rng.below(2) == 0 { 0 } else { 5 },
            max_concurrent: 1 + rng.below(3) as usize,
            timeout_ms: 50 + rng.below(450),
            tolerable_failures: rng.below(4) as u32,
            region_of: region_of.clone(),
            initiators,
        };
        let machine = SupervisorMachine::new(config).expect("a valid schedule");
        let mut world = World {
            rng,
            seed,
            machine,
            now_ms: 0,
            region_of,
            running: vec![false; regions],
            generation: vec![0; regions],
            next_generation: 1,
            stopped: (0..regions).collect(),
            owed: Vec::new(),
            completions: Vec::new(),
            late: Vec::new(),
            persisting: Vec::new(),
            durable: BTreeSet::new(),
            highest_triggered: 0,
            kinds: Vec::new(),
            ended_nodes: vec![false; nodes],
            committed: vec![None; nodes],
            fatal: false,
            stop_requested: false,
            floor: 0,
            ended: false,
            seen: Seen::default(),
        };
        while !world.stopped.is_empty() {
            world.restart_one();
        }
        world
    }

    /// One random event, then its commands, checked.
    fn step(&mut self) {
        self.now_ms += self.rng.below(20);
        match self.rng.below(100) {
            0..=34 => self.ack(),
            35..=37 => self.decline(),
            38..=40 => self.fail(),
            41..=55 => self.persisted(),
            56..=70 => self.timer(),
            71..=72 => self.deliver(Event::SavepointRequested),
            73 => {
                self.stop_requested = true;
                self.deliver(Event::StopRequested { savepoint: true });
            }
            74..=79 => self.late(),
            80..=84 => self.restart_one(),
            85..=87 => self.inputs_ended(),
            88..=97 => self.commit(),
            98 => {
                // Acks out of order: shuffle what is owed.
                let len = self.owed.len();
                for index in (1..len).rev() {
                    let other = self.rng.below(index as u64 + 1) as usize;
                    self.owed.swap(index, other);
                }
            }
            _ => {
                if self.rng.below(10) == 0 {
                    self.deliver(Event::StopRequested { savepoint: false });
                }
            }
        }
    }

    fn pick<T>(&mut self, items: &mut Vec<T>) -> Option<T> {
        if items.is_empty() {
            return None;
        }
        let index = self.rng.below(items.len() as u64) as usize;
        Some(items.swap_remove(index))
    }

    fn ack(&mut self) {
        let mut owed = std::mem::take(&mut self.owed);
        let picked = self.pick(&mut owed);
        self.owed = owed;
        let Some((node, checkpoint, generation)) = picked else {
            return;
        };
        let event = Event::Ack {
            node,
            generation: Generation(generation),
            checkpoint: CheckpointId(checkpoint),
            part: (node, checkpoint, generation),
        };
        if self.rng.below(20) == 0 {
            // A duplicate ack must change nothing.
            self.deliver(event.clone());
        }
        self.deliver(event);
    }

    fn decline(&mut self) {
        let mut owed = std::mem::take(&mut self.owed);
        let picked = self.pick(&mut owed);
        self.owed = owed;
        if let Some((node, checkpoint, generation)) = picked {
            self.deliver(Event::Decline {
                node,
                generation: Generation(generation),
                checkpoint: CheckpointId(checkpoint),
                reason: DeclineReason::Subsumed,
            });
        }
    }

    fn fail(&mut self) {
        let node = self.rng.below(self.region_of.len() as u64) as usize;
        let region = self.region_of[node];
        let retryable = self.rng.below(25) != 0;
        let generation = self.generation[region];
        self.fatal = !retryable && self.running[region] && !self.ended;
        self.deliver(Event::Failed {
            node,
            generation: Generation(generation),
            retryable,
        });
        assert!(
            !self.fatal,
            "seed {}: a non-retryable failure did not end the job",
            self.seed
        );
    }

    fn persisted(&mut self) {
        let mut persisting = std::mem::take(&mut self.persisting);
        let picked = self.pick(&mut persisting);
        self.persisting = persisting;
        let Some((epoch, checkpoint)) = picked else {
            return;
        };
        let outcome = match self.rng.below(20) {
            0..=2 => PersistResult::Failed,
            3 => PersistResult::Subsumed,
            _ => PersistResult::Durable,
        };
        if outcome == PersistResult::Durable {
            self.durable.insert(checkpoint);
            self.seen.durable += 1;
        }
        if outcome == PersistResult::Failed {
            self.seen.persist_failures += 1;
        }
        self.deliver(Event::Persisted {
            epoch,
            checkpoint: CheckpointId(checkpoint),
            outcome,
        });
    }

    fn timer(&mut self) {
        if let Some(due_ms) = self.machine.poll_timeout() {
            self.now_ms = self.now_ms.max(due_ms);
        }
        self.deliver(Event::Timer);
    }

    fn late(&mut self) {
        let mut late = std::mem::take(&mut self.late);
        let picked = self.pick(&mut late);
        self.late = late;
        if let Some(event) = picked {
            self.seen.late += 1;
            self.deliver(event);
        }
    }

    fn inputs_ended(&mut self) {
        let node = self.rng.below(self.region_of.len() as u64) as usize;
        let region = self.region_of[node];
        if !self.running[region] || self.ended_nodes[node] {
            return;
        }
        self.ended_nodes[node] = true;
        let generation = Generation(self.generation[region]);
        self.deliver(Event::InputsEnded { node, generation });
    }

    fn commit(&mut self) {
        let mut completions = std::mem::take(&mut self.completions);
        let picked = self.pick(&mut completions);
        self.completions = completions;
        let Some((node, checkpoint, generation)) = picked else {
            return;
        };
        if self.generation[self.region_of[node]] == generation {
            let committed = &mut self.committed[node];
            *committed = (*committed).max(Some(checkpoint));
        }
        self.deliver(Event::Committed {
            node,
            generation: Generation(generation),
            checkpoint: CheckpointId(checkpoint),
        });
    }

    /// Starts a new generation of one stopped region, restored from the
    /// newest durable checkpoint (or an older floor).
    fn restart_one(&mut self) {
        let mut stopped = std::mem::take(&mut self.stopped);
        let picked = self.pick(&mut stopped);
        self.stopped = stopped;
        let Some(region) = picked else {
            return;
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        if generation > self.running.len() as u64 {
            self.seen.restarts += 1;
        }
        self.generation[region] = generation;
        self.running[region] = true;
        for node in 0..self.region_of.len() {
            if self.region_of[node] == region {
                self.ended_nodes[node] = false;
                self.committed[node] = None;
            }
        }
        let durable = self.durable.iter().next_back().copied().unwrap_or(0);
        self.floor = self.floor.max(durable);
        self.deliver(Event::RegionStarted {
            region,
            generation: Generation(generation),
            id_floor: CheckpointId(durable),
        });
    }

    /// Stops `regions`: what their subtasks still owed becomes late.
    fn stop(&mut self, regions: Vec<usize>) {
        for &region in &regions {
            self.running[region] = false;
            self.stopped.push(region);
        }
        let region_of = &self.region_of;
        let (gone, kept): (Vec<Part>, Vec<Part>) = self
            .owed
            .drain(..)
            .partition(|(node, ..)| regions.contains(&region_of[*node]));
        self.owed = kept;
        for (node, checkpoint, generation) in gone {
            self.late.push(Event::Ack {
                node,
                generation: Generation(generation),
                checkpoint: CheckpointId(checkpoint),
                part: (node, checkpoint, generation),
            });
        }
        let (gone, kept): (Vec<Part>, Vec<Part>) = self
            .completions
            .drain(..)
            .partition(|(node, ..)| regions.contains(&region_of[*node]));
        self.completions = kept;
        for (node, checkpoint, generation) in gone {
            self.late.push(Event::Committed {
                node,
                generation: Generation(generation),
                checkpoint: CheckpointId(checkpoint),
            });
        }
        self.late.truncate(64);
        self.deliver(Event::RegionsStopped { regions });
    }

    /// Delivers `event` and carries out its commands, checking each.
    fn deliver(&mut self, event: Event<Part>) {
        self.machine.handle(event, self.now_ms);
        while let Some(command) = self.machine.poll_command() {
            self.carry_out(command);
        }
    }

    fn carry_out(&mut self, command: Command<Part>) {
        let seed = self.seed;
        assert!(!self.ended, "seed {seed}: {command:?} after the job ended");
        match command {
            Command::Send { node, message } => {
                let region = self.region_of[node];
                assert!(
                    self.running[region],
                    "seed {seed}: {message:?} sent to node {node} of a stopped region"
                );
                let generation = self.generation[region];
                match message {
                    ToSubtask::Trigger(checkpoint, kind) => {
                        let triggered = self.kinds.iter().find(|(id, _)| *id == checkpoint.0);
                        assert_eq!(
                            triggered.map(|(_, kind)| *kind),
                            Some(kind),
                            "seed {seed}: a trigger carries its checkpoint's kind"
                        );
                    }
                    ToSubtask::Complete(checkpoint) => {
                        assert!(
                            self.durable.contains(&checkpoint.0),
                            "seed {seed}: {checkpoint} completed before it was durable"
                        );
                        self.completions.push((node, checkpoint.0, generation));
                        self.seen.completions += 1;
                    }
                    ToSubtask::Abort(checkpoint) => {
                        if self.rng.below(2) == 0 {
                            self.owed.retain(|(_, id, _)| *id != checkpoint.0);
                        }
                    }
                }
            }
            Command::Triggered { checkpoint, kind } => {
                assert!(
                    checkpoint.0 > self.highest_triggered && checkpoint.0 > self.floor,
                    "seed {seed}: {checkpoint} after {} (floor {}): ids rise",
                    self.highest_triggered,
                    self.floor
                );
                self.highest_triggered = checkpoint.0;
                if kind == CheckpointKind::Savepoint {
                    self.seen.savepoints += 1;
                }
                self.kinds.push((checkpoint.0, kind));
                if self.kinds.len() > 32 {
                    self.kinds.remove(0);
                }
                // Barriers reach every subtask, which all owe an ack.
                for node in 0..self.region_of.len() {
                    let generation = self.generation[self.region_of[node]];
                    self.owed.push((node, checkpoint.0, generation));
                }
            }
            Command::Persist {
                epoch,
                checkpoint,
                parts,
                ..
            } => {
                assert_eq!(parts.len(), self.region_of.len(), "seed {seed}: every part");
                for (node, part) in parts.iter().enumerate() {
                    let generation = self.generation[self.region_of[node]];
                    assert_eq!(
                        *part,
                        (node, checkpoint.0, generation),
                        "seed {seed}: {checkpoint} holds only its own acks of current generations"
                    );
                }
                self.persisting.push((epoch, checkpoint.0));
            }
            Command::Durable { checkpoint, .. } => {
                assert!(
                    self.durable.contains(&checkpoint.0),
                    "seed {seed}: {checkpoint} reported durable before the writer said so"
                );
            }
            Command::SubsumeBelow(_) | Command::Aborted { .. } | Command::Resumed => {}
            Command::RegionFailed { region, .. } => {
                assert!(self.running[region], "seed {seed}: a stopped region failed");
                self.stop(vec![region]);
            }
            Command::CheckpointsFailing { .. } => {
                let running = (0..self.running.len())
                    .filter(|&region| self.running[region])
                    .collect();
                self.stop(running);
            }
            Command::Finish(ending) => {
                match ending {
                    Ending::NotRetryable { .. } => {
                        assert!(self.fatal, "seed {seed}: ended without a fatal failure");
                        self.fatal = false;
                        self.seen.not_retryable += 1;
                    }
                    Ending::Finished => {
                        let all = self.committed.iter().all(Option::is_some);
                        assert!(all, "seed {seed}: finished before every subtask committed");
                        assert!(
                            self.ended_nodes.iter().all(|ended| *ended) || self.stop_requested,
                            "seed {seed}: finished while inputs remain and no stop was asked"
                        );
                        self.seen.finished += 1;
                    }
                    Ending::Cancelled => {}
                }
                self.ended = true;
            }
        }
    }
}
