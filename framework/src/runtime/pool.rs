//! A fixed pool of arbiters (one thread each) and the placement of actors on
//! them.
//!
//! This module owns the arbiter threads, a private actix `System` thread they
//! register with, where each actor runs, the watcher task that reports an
//! actor whose task ended in a panic, and clean shutdown (stop, then join every
//! thread). It never interprets messages and never restarts actors.
//!
//! Actors are not `Send`, so each is built by a factory closure on its
//! arbiter's thread. An actor's address can exist before the actor does
//! ([`ActorSlot`]), which is how a graph with cycles is wired: make every
//! slot, build the channels from the slots' addresses, then start the actors.

use std::num::NonZeroUsize;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;

use actix::dev::channel::{channel, AddressReceiver};
use actix::{Actor, Addr, Arbiter, ArbiterHandle, Context, System};

use super::failure::{panic_message, FailureKind, FailureReport, FailureSink};
use super::{ActorTag, RuntimeError};

/// The mailbox capacity given to every actor. Only `send()` and `try_send()`
/// look at it; channels use `do_send`, which ignores it (the bound on queued
/// data comes from credits, see [`super::channel`]).
const MAILBOX_CAPACITY: usize = 16;

/// How many arbiters a pool has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// The number of arbiter threads.
    pub arbiters: NonZeroUsize,
}

impl Default for PoolConfig {
    /// One arbiter per available core (one if that cannot be determined).
    fn default() -> Self {
        Self {
            arbiters: thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
        }
    }
}

/// Where to start an actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The next arbiter in round-robin order.
    RoundRobin,
    /// The arbiter with this index (from 0).
    Arbiter(usize),
}

/// The mailbox of an actor that is not started yet: its address can be
/// handed out (to channels, to other actors) before the actor exists.
///
/// Messages sent to the address before the actor starts wait in the mailbox.
/// If the slot is dropped without starting the actor, the address is
/// disconnected and later `do_send`s are dropped.
pub struct ActorSlot<A: Actor<Context = Context<A>>> {
    address: Addr<A>,
    receiver: AddressReceiver<A>,
}

impl<A: Actor<Context = Context<A>>> ActorSlot<A> {
    /// Makes an empty mailbox.
    pub fn new() -> Self {
        let (sender, receiver) = channel(MAILBOX_CAPACITY);
        Self {
            address: Addr::new(sender),
            receiver,
        }
    }

    /// The address the actor will have once started.
    pub fn address(&self) -> Addr<A> {
        self.address.clone()
    }
}

impl<A: Actor<Context = Context<A>>> Default for ActorSlot<A> {
    fn default() -> Self {
        Self::new()
    }
}

/// A fixed set of arbiters. Dropping the pool shuts it down (errors are then
/// only logged); call [`ArbiterPool::shutdown`] to see them.
///
/// Shut the pool down (or drop it) from a thread outside the pool: an
/// arbiter cannot join its own thread, so doing it from an actor deadlocks.
pub struct ArbiterPool {
    arbiters: Vec<Arbiter>,
    handles: Vec<ArbiterHandle>,
    next: AtomicUsize,
    system: Option<(System, thread::JoinHandle<std::io::Result<()>>)>,
}

impl ArbiterPool {
    /// Starts a private actix system thread and `config.arbiters` arbiters.
    pub fn new(config: PoolConfig) -> Result<Self, RuntimeError> {
        let count = config.arbiters.get();
        let (ready_sender, ready_receiver) = mpsc::channel();
        let system_thread = thread::Builder::new()
            .name("snapflow-system".to_owned())
            .spawn(move || {
                let runner = System::new();
                let arbiters: Result<Vec<Arbiter>, std::io::Error> =
                    (0..count).map(|_| Arbiter::try_new()).collect();
                let started = arbiters.is_ok();
                // The receiver waits for exactly this message, so the send
                // only fails if the constructor thread is gone; then nobody
                // is left to use the system either.
                let _ = ready_sender.send((System::current(), arbiters));
                if started {
                    runner.run()
                } else {
                    Ok(())
                }
            })
            .map_err(RuntimeError::ThreadStart)?;
        let (system, arbiters) = match ready_receiver.recv() {
            Ok(ready) => ready,
            Err(_) => return Err(join_failure("snapflow-system", system_thread)),
        };
        let arbiters = match arbiters {
            Ok(arbiters) => arbiters,
            Err(error) => {
                let _ = system_thread.join();
                return Err(RuntimeError::ThreadStart(error));
            }
        };
        let handles = arbiters.iter().map(Arbiter::handle).collect();
        Ok(Self {
            arbiters,
            handles,
            next: AtomicUsize::new(0),
            system: Some((system, system_thread)),
        })
    }

    /// A pool with one arbiter per available core.
    pub fn with_default_size() -> Result<Self, RuntimeError> {
        Self::new(PoolConfig::default())
    }

    /// The number of arbiters.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Always false: a pool has at least one arbiter. Present because
    /// `len` is.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// The handle of arbiter `index`, to spawn plain futures on it.
    pub fn handle(&self, index: usize) -> Result<ArbiterHandle, RuntimeError> {
        self.handles
            .get(index)
            .cloned()
            .ok_or(RuntimeError::PlacementOutOfRange {
                index,
                len: self.len(),
            })
    }

    /// Resolves a placement to an arbiter index.
    pub fn resolve(&self, placement: Placement) -> Result<usize, RuntimeError> {
        match placement {
            Placement::RoundRobin => Ok(self.next.fetch_add(1, Ordering::Relaxed) % self.len()),
            Placement::Arbiter(index) if index < self.len() => Ok(index),
            Placement::Arbiter(index) => Err(RuntimeError::PlacementOutOfRange {
                index,
                len: self.len(),
            }),
        }
    }

    /// Starts an actor built by `factory` on its arbiter's thread, with a
    /// fresh mailbox. See [`ArbiterPool::start_in_slot`].
    pub fn start<A, F>(
        &self,
        placement: Placement,
        tag: ActorTag,
        failures: FailureSink,
        factory: F,
    ) -> Result<Addr<A>, RuntimeError>
    where
        A: Actor<Context = Context<A>>,
        F: FnOnce(&mut Context<A>) -> A + Send + 'static,
    {
        self.start_in_slot(ActorSlot::new(), placement, tag, failures, factory)
    }

    /// Starts an actor in a mailbox made earlier, so messages already sent to
    /// the slot's address are delivered to it.
    ///
    /// The actor runs as its own task on the arbiter, watched by a second
    /// task: if the actor's task ends in a panic (one no [`super::failure::guard`]
    /// caught), the watcher sends a [`FailureKind::ActorTaskPanicked`] report.
    /// A panicking `factory` is reported as
    /// [`FailureKind::ConstructorPanicked`] and the actor never starts.
    pub fn start_in_slot<A, F>(
        &self,
        slot: ActorSlot<A>,
        placement: Placement,
        tag: ActorTag,
        failures: FailureSink,
        factory: F,
    ) -> Result<Addr<A>, RuntimeError>
    where
        A: Actor<Context = Context<A>>,
        F: FnOnce(&mut Context<A>) -> A + Send + 'static,
    {
        let index = self.resolve(placement)?;
        let ActorSlot { address, receiver } = slot;
        let spawned = self.handles[index].spawn_fn(move || {
            run_watched(receiver, tag, failures, factory);
        });
        if spawned {
            Ok(address)
        } else {
            Err(RuntimeError::ArbiterStopped { index })
        }
    }

    /// Stops every arbiter (dropping the actors on it), joins their threads,
    /// then stops and joins the system thread.
    ///
    /// Returns the first error; every thread is joined either way.
    pub fn shutdown(mut self) -> Result<(), RuntimeError> {
        self.shutdown_inner()
    }

    fn shutdown_inner(&mut self) -> Result<(), RuntimeError> {
        let mut first_error = None;
        for arbiter in &self.arbiters {
            arbiter.stop();
        }
        for (index, arbiter) in self.arbiters.drain(..).enumerate() {
            if let Err(payload) = arbiter.join() {
                first_error.get_or_insert(RuntimeError::ThreadPanicked {
                    thread: format!("arbiter {index}"),
                    message: panic_message(payload.as_ref()),
                });
            }
        }
        self.handles.clear();
        if let Some((system, thread)) = self.system.take() {
            system.stop();
            match thread.join() {
                Ok(_) => {}
                Err(payload) => {
                    first_error.get_or_insert(RuntimeError::ThreadPanicked {
                        thread: "snapflow-system".to_owned(),
                        message: panic_message(payload.as_ref()),
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for ArbiterPool {
    fn drop(&mut self) {
        if let Err(error) = self.shutdown_inner() {
            tracing::error!("arbiter pool shutdown: {error}");
        }
    }
}

/// Builds the actor on the current (arbiter) thread, spawns its task and a
/// watcher task that reports a panic that ended it.
fn run_watched<A, F>(receiver: AddressReceiver<A>, tag: ActorTag, failures: FailureSink, factory: F)
where
    A: Actor<Context = Context<A>>,
    F: FnOnce(&mut Context<A>) -> A,
{
    let mut context = Context::with_receiver(receiver);
    let actor = match catch_unwind(AssertUnwindSafe(|| factory(&mut context))) {
        Ok(actor) => actor,
        Err(payload) => {
            failures.report(FailureReport {
                tag,
                kind: FailureKind::ConstructorPanicked,
                message: panic_message(payload.as_ref()),
                retryable: true,
            });
            return;
        }
    };
    let task = actix::spawn(context.into_future(actor));
    actix::spawn(async move {
        match task.await {
            Err(error) if error.is_panic() => {
                failures.report(FailureReport {
                    tag,
                    kind: FailureKind::ActorTaskPanicked,
                    message: panic_message(error.into_panic().as_ref()),
                    retryable: true,
                });
            }
            // A cancelled task means the arbiter is shutting down: not a
            // failure of the actor.
            Err(_) | Ok(()) => {}
        }
    });
}

fn join_failure(name: &str, thread: thread::JoinHandle<std::io::Result<()>>) -> RuntimeError {
    match thread.join() {
        Err(payload) => RuntimeError::ThreadPanicked {
            thread: name.to_owned(),
            message: panic_message(payload.as_ref()),
        },
        Ok(Err(error)) => RuntimeError::ThreadStart(error),
        Ok(Ok(())) => RuntimeError::ThreadPanicked {
            thread: name.to_owned(),
            message: "exited before reporting readiness".to_owned(),
        },
    }
}
