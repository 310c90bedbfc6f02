//! Small scheduling helpers shared by the stage and source actors: run a
//! method of the actor later in its own context (right after the current
//! mailbox turn, or after yielding the arbiter thread), and keep one linger
//! timer per actor armed for the earliest open batch.
//!
//! This module owns no state of its own beyond one timer flag, and never
//! decides what the actor does when it runs.

use std::time::Instant;

use actix::fut::{wrap_future, ActorFutureExt};
use actix::{Actor, AsyncContext, Context};

use super::channel::Outputs;

/// When a scheduled run happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// In the same poll of the actor, after its mailbox is drained. This does
    /// not yield: actix runs context items in a loop until none is ready.
    Now,
    /// After yielding the arbiter thread to every other ready task and the
    /// timer and I/O drivers (`tokio::task::yield_now` defers the wake-up
    /// until the scheduler has polled the driver). This is what keeps timers
    /// on a busy arbiter on time.
    AfterYield,
}

/// Runs `run` on the actor at `turn`.
pub(crate) fn schedule<A>(context: &mut Context<A>, turn: Turn, run: fn(&mut A, &mut Context<A>))
where
    A: Actor<Context = Context<A>>,
{
    let wait = async move {
        if turn == Turn::AfterYield {
            actix_rt::task::yield_now().await;
        }
    };
    context.spawn(wrap_future::<_, A>(wait).map(move |(), actor, context| run(actor, context)));
}

/// One linger timer per actor: armed for the earliest linger deadline of the
/// actor's outputs, re-armed when it fires while batches are still open.
/// One timer (not one per batch) keeps the actor's context small; actix
/// polls every context item on every turn.
#[derive(Debug, Default)]
pub(crate) struct LingerTimer {
    armed: bool,
}

impl LingerTimer {
    /// Arms the timer if it is not armed and some batch is open.
    pub(crate) fn arm<A, T, C>(
        &mut self,
        outputs: &Outputs<T, C>,
        context: &mut Context<A>,
        fire: fn(&mut A, &mut Context<A>),
    ) where
        A: Actor<Context = Context<A>>,
        T: Send + 'static,
        C: Send + 'static,
    {
        if self.armed {
            return;
        }
        if let Some(deadline) = outputs.linger_deadline() {
            self.armed = true;
            let delay = deadline.saturating_duration_since(Instant::now());
            context.run_later(delay, fire);
        }
    }

    /// Marks the timer as fired; the caller flushes and re-arms.
    pub(crate) fn fired(&mut self) {
        self.armed = false;
    }
}
