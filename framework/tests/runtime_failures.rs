//! Failures and placement on the runtime layer: panics and errors in user
//! callbacks become typed reports and do not take the process down; a panic
//! that escapes every guard is caught by the task watcher; the arbiter pool
//! places actors round-robin or by index and shuts down cleanly.

mod runtime_support;

use std::num::NonZeroUsize;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use actix::{Actor, Context, Handler, Message};
use runtime_support::*;
use snapflow::runtime::failure::{FailureKind, FailureReport};
use snapflow::runtime::pool::{ArbiterPool, Placement, PoolConfig};
use snapflow::runtime::{ActorTag, Generation, RuntimeError};

fn pool(arbiters: usize) -> ArbiterPool {
    let arbiters = NonZeroUsize::new(arbiters).expect("arbiters > 0");
    ArbiterPool::new(PoolConfig { arbiters }).expect("start pool")
}

/// Runs a two-subtask pipeline whose map 1 fails at record 500; the report
/// must name it, and subtask 0 must still deliver its whole stream.
fn check_map_failure(fail_with_error: bool, kind: FailureKind, message: &str) {
    let spec = PipelineSpec {
        parallelism: 2,
        records_per_source: 2_000,
        map_fail_at: Some((1, 500)),
        map_fail_with_error: fail_with_error,
        generation: Generation(3),
        ..PipelineSpec::default()
    };
    let pool = pool(2);
    let pipeline = start_pipeline(&pool, &spec);
    let report = pipeline
        .failures
        .recv_timeout(WAIT)
        .expect("a failure report");
    let expected = FailureReport {
        tag: ActorTag::new("map", 1, Generation(3)),
        kind,
        message: message.to_owned(),
        retryable: true,
    };
    assert_eq!(report, expected);
    let healthy = collect_input_until_end(&pipeline.events, 0);
    assert_eq!(healthy, expected_stream(0, 2_000, 0));
    assert!(
        pipeline.failures.try_recv().is_err(),
        "one failure, one report"
    );
    pool.shutdown()
        .expect("the pool shuts down cleanly after a failure");
}

/// What input `input` carried up to its End, ignoring other inputs.
fn collect_input_until_end(events: &mpsc::Receiver<SinkEvent>, wanted: usize) -> Vec<Seen> {
    let mut seen = Vec::new();
    loop {
        match events.recv_timeout(WAIT).expect("sink events") {
            SinkEvent::Batch { input, records } if input == wanted => {
                seen.extend(records.into_iter().map(Seen::Record));
            }
            SinkEvent::Control { input, control } if input == wanted => {
                seen.push(Seen::Control(control));
                if control == Ctl::End {
                    return seen;
                }
            }
            _ => {}
        }
    }
}

#[test]
fn a_panicking_callback_is_reported_and_the_rest_keeps_running() {
    check_map_failure(
        false,
        FailureKind::CallbackPanicked,
        "map failed at record 500",
    );
}

#[test]
fn a_failing_callback_is_reported_and_the_rest_keeps_running() {
    check_map_failure(true, FailureKind::CallbackFailed, "map rejected record 500");
}

/// An actor whose handler panics with no guard around it.
struct Bomb;

impl Actor for Bomb {
    type Context = Context<Self>;
}

struct Detonate(u32);

impl Message for Detonate {
    type Result = ();
}

impl Handler<Detonate> for Bomb {
    type Result = ();

    fn handle(&mut self, message: Detonate, _context: &mut Context<Self>) {
        panic!("unguarded panic {}", message.0);
    }
}

#[test]
fn a_panic_that_escapes_every_guard_is_reported_by_the_watcher() {
    let pool = pool(1);
    let (failures, reports) = failure_channel();
    let tag = ActorTag::new("bomb", 4, Generation(2));
    let address = pool
        .start(Placement::RoundRobin, tag.clone(), failures, |_| Bomb)
        .expect("start");
    address.do_send(Detonate(42));
    let report = reports.recv_timeout(WAIT).expect("a watcher report");
    let expected = FailureReport {
        tag,
        kind: FailureKind::ActorTaskPanicked,
        message: "unguarded panic 42".to_owned(),
        retryable: true,
    };
    assert_eq!(report, expected);
    let deadline = Instant::now() + WAIT;
    while address.connected() {
        assert!(
            Instant::now() < deadline,
            "the dead actor's address stayed connected"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    pool.shutdown().expect("shutdown");
}

#[test]
fn a_panicking_constructor_is_reported() {
    let pool = pool(1);
    let (failures, reports) = failure_channel();
    let tag = ActorTag::new("broken", 0, Generation(1));
    let _address = pool
        .start::<Bomb, _>(Placement::Arbiter(0), tag.clone(), failures, |_| {
            panic!("cannot build")
        })
        .expect("start");
    let report = reports.recv_timeout(WAIT).expect("a report");
    let expected = FailureReport {
        tag,
        kind: FailureKind::ConstructorPanicked,
        message: "cannot build".to_owned(),
        retryable: true,
    };
    assert_eq!(report, expected);
    pool.shutdown().expect("shutdown");
}

/// Starts an actor that reports the name of the thread it was built on.
fn start_reporting(
    pool: &ArbiterPool,
    placement: Placement,
    index: usize,
    names: &mpsc::Sender<(usize, String)>,
) {
    let names = names.clone();
    let (failures, _) = failure_channel();
    let tag = ActorTag::new("probe", 0, Generation(1));
    pool.start(placement, tag, failures, move |_| {
        let name = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_owned();
        let _ = names.send((index, name));
        Bomb
    })
    .expect("start");
}

#[test]
fn actors_are_built_on_their_arbiters_round_robin_or_by_index() {
    let pool = pool(3);
    assert_eq!(pool.len(), 3);
    let (sender, names) = mpsc::channel();
    for index in 0..6 {
        start_reporting(&pool, Placement::RoundRobin, index, &sender);
    }
    start_reporting(&pool, Placement::Arbiter(1), 6, &sender);
    // Actors on different arbiters are built concurrently: sort by index.
    let mut indexed: Vec<(usize, String)> = (0..7)
        .map(|_| names.recv_timeout(WAIT).expect("a name"))
        .collect();
    indexed.sort();
    let names: Vec<String> = indexed.into_iter().map(|(_, name)| name).collect();
    let caller = std::thread::current().name().map(str::to_owned);
    assert!(names.iter().all(|name| Some(name) != caller.as_ref()));
    assert_ne!(names[0], names[1]);
    assert_ne!(names[1], names[2]);
    assert_ne!(names[0], names[2]);
    assert_eq!(names[0..3], names[3..6]);
    assert_eq!(names[6], names[1]);
    pool.shutdown().expect("shutdown");
}

#[test]
fn placing_an_actor_beyond_the_pool_is_a_typed_error() {
    let pool = pool(2);
    let (failures, _) = failure_channel();
    let tag = ActorTag::new("probe", 0, Generation(1));
    let error = pool
        .start(Placement::Arbiter(2), tag, failures, |_| Bomb)
        .expect_err("out of range");
    assert!(matches!(
        error,
        RuntimeError::PlacementOutOfRange { index: 2, len: 2 }
    ));
    assert!(!error.is_retryable());
    pool.shutdown().expect("shutdown");
}

#[test]
fn a_default_pool_has_one_arbiter_per_core() {
    let cores = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    let pool = ArbiterPool::with_default_size().expect("start pool");
    assert_eq!(pool.len(), cores);
    pool.shutdown().expect("shutdown");
}
