//! A graceful stop on SIGTERM and SIGINT ([`RunningJob::stop_on_signals`]):
//! the first signal stops the job with a savepoint (Flink's `stop`), the
//! second cancels it, a third ends the process as the signal would by
//! default (in case the cancel itself is stuck in user code).
//!
//! It owns the signal thread of a running job and the process-wide
//! bookkeeping that gives SIGTERM and SIGINT back their default action
//! (ending the process) while no job watches them. The choice per signal
//! is the pure [`action_for`]; the thread only carries it out by sending
//! the supervisor the same `Stop` message `cancel` and
//! `stop_with_savepoint` send. Signals arrive through signal-hook's
//! iterator, whose handler only writes to a pipe, so nothing here runs
//! inside a signal handler. See `docs/design/graceful-stop.md`.

use std::io;
#[cfg(unix)]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(unix)]
use std::sync::{Arc, Mutex, OnceLock};
#[cfg(unix)]
use std::thread;

#[cfg(unix)]
use actix::Addr;

use super::RunningJob;
#[cfg(unix)]
use super::{Stop, Supervisor};

/// What one more signal does, by how many arrived so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SignalAction {
    /// Stop with a savepoint and commit what it covers.
    StopWithSavepoint,
    /// Stop at once without a savepoint.
    Cancel,
    /// End the process as the signal's default action does.
    Terminate,
}

/// The action for the `received`-th signal (from 1).
pub(crate) fn action_for(received: u32) -> SignalAction {
    match received {
        0 | 1 => SignalAction::StopWithSavepoint,
        2 => SignalAction::Cancel,
        _ => SignalAction::Terminate,
    }
}

/// The signals a service manager or a terminal sends to stop a process.
#[cfg(unix)]
const STOP_SIGNALS: [i32; 2] = [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT];

/// A job's signal thread; dropping it stops the thread and, if no other
/// job watches, gives the signals back their default action.
#[cfg(unix)]
pub(super) struct SignalWatch {
    handle: signal_hook::iterator::Handle,
    thread: Option<thread::JoinHandle<()>>,
}

#[cfg(not(unix))]
pub(super) struct SignalWatch;

#[cfg(unix)]
impl Drop for SignalWatch {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(thread) = self.thread.take() {
            // The thread only forwards signals; a panic there lost nothing.
            let _ = thread.join();
        }
        watchers().leave();
    }
}

/// How many jobs watch the signals, and the flag that lets them end the
/// process by default while none does.
#[cfg(unix)]
struct Watchers {
    count: Mutex<usize>,
    /// True while no job watches (and after a job's second signal):
    /// the signal then runs its default action, ending the process.
    default_action: Arc<AtomicBool>,
}

#[cfg(unix)]
impl Watchers {
    fn join(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *count += 1;
        self.default_action.store(false, Ordering::SeqCst);
    }

    fn leave(&self) {
        let mut count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        *count = count.saturating_sub(1);
        if *count == 0 {
            self.default_action.store(true, Ordering::SeqCst);
        }
    }
}

/// The process's watchers. The conditional default action is registered
/// once per process and never removed: unregistering signal-hook's last
/// action for a signal would leave the signal ignored, not default.
#[cfg(unix)]
fn watchers() -> &'static Watchers {
    static WATCHERS: OnceLock<Watchers> = OnceLock::new();
    WATCHERS.get_or_init(|| Watchers {
        count: Mutex::new(0),
        default_action: Arc::new(AtomicBool::new(true)),
    })
}

#[cfg(unix)]
fn register_default_action() -> io::Result<()> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    let registered = REGISTERED.get_or_init(|| {
        let flag = &watchers().default_action;
        for signal in STOP_SIGNALS {
            signal_hook::flag::register_conditional_default(signal, Arc::clone(flag))
                .map_err(|error| error.to_string())?;
        }
        Ok(())
    });
    registered.clone().map_err(io::Error::other)
}

impl RunningJob {
    /// Stops this job gracefully on SIGTERM or SIGINT (Ctrl-C), the
    /// signals a service manager, a container runtime or a terminal sends
    /// to stop a process: the first one does
    /// [`RunningJob::stop_with_savepoint`] (the sinks commit what the
    /// savepoint covers, and [`RunningJob::wait`] returns a report whose
    /// [`JobReport::savepoint`](crate::job::JobReport::savepoint) names it;
    /// a new run on the same store resumes from it), the second
    /// [`RunningJob::cancel`] (no savepoint; `wait` returns
    /// [`JobError::Cancelled`](crate::job::JobError::Cancelled)), and a
    /// third ends the process as the signal's default action does.
    ///
    /// Once the job has ended (or this handle is dropped) the signals end
    /// the process by default again. Calling it twice keeps one watch.
    /// Two jobs of one process that both call it are both stopped by one
    /// signal. Unix only: elsewhere it returns an
    /// [`io::ErrorKind::Unsupported`] error.
    ///
    /// # Errors
    ///
    /// The operating system's, when the handlers or the thread cannot be
    /// set up; the job runs on, without the watch.
    pub fn stop_on_signals(&self) -> io::Result<()> {
        #[cfg(unix)]
        {
            let mut slot = self.signals.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(watch(self.supervisor.clone())?);
            }
            Ok(())
        }
        #[cfg(not(unix))]
        {
            let _ = &self.signals;
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "stopping on signals needs Unix",
            ))
        }
    }
}

/// Starts the signal thread of the job behind `supervisor`.
#[cfg(unix)]
fn watch(supervisor: Addr<Supervisor>) -> io::Result<SignalWatch> {
    register_default_action()?;
    // Counted first: from here on a signal must not end the process.
    watchers().join();
    let started = start_thread(supervisor);
    if started.is_err() {
        watchers().leave();
    }
    started
}

#[cfg(unix)]
fn start_thread(supervisor: Addr<Supervisor>) -> io::Result<SignalWatch> {
    let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)?;
    let handle = signals.handle();
    let thread = thread::Builder::new()
        .name("snapflow-signals".into())
        .spawn(move || {
            let mut received = 0_u32;
            for signal in signals.forever() {
                received = received.saturating_add(1);
                carry_out(action_for(received), signal, &supervisor);
            }
        });
    match thread {
        Ok(thread) => Ok(SignalWatch {
            handle,
            thread: Some(thread),
        }),
        Err(error) => {
            handle.close();
            Err(error)
        }
    }
}

#[cfg(unix)]
fn carry_out(action: SignalAction, signal: i32, supervisor: &Addr<Supervisor>) {
    match action {
        SignalAction::StopWithSavepoint => {
            tracing::warn!(
                signal,
                "stop signal: stopping with a savepoint (a second signal cancels at once)"
            );
            supervisor.do_send(Stop { savepoint: true });
        }
        SignalAction::Cancel => {
            tracing::warn!(
                signal,
                "second stop signal: cancelling without a savepoint (a third ends the process)"
            );
            supervisor.do_send(Stop { savepoint: false });
        }
        SignalAction::Terminate => {
            tracing::error!(signal, "third stop signal: ending the process");
            if let Err(error) = signal_hook::low_level::emulate_default_handler(signal) {
                tracing::error!(%error, "could not end the process");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(received: u32, expected: SignalAction) {
        assert_eq!(action_for(received), expected, "signal {received}");
    }

    #[test]
    #[rustfmt::skip]
    fn the_first_signal_stops_with_a_savepoint_the_second_cancels_the_third_terminates() {
        check(1, SignalAction::StopWithSavepoint);
        check(2, SignalAction::Cancel);
        check(3, SignalAction::Terminate);
        check(u32::MAX, SignalAction::Terminate);
    }
}
