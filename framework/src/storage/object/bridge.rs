//! The bridge from the store's synchronous [`Io`](crate::storage::io::Io)
//! calls to the asynchronous object store: a small multi-thread tokio
//! runtime that the store owns, and a bounded wait for each result on a
//! standard channel.
//!
//! The store is called from actix's threads, which are themselves inside a
//! tokio runtime, where `block_on` of another runtime panics. So a request
//! is spawned onto this runtime and the calling thread waits on a
//! `std::sync::mpsc` channel, as it would wait for a disk. This module never
//! knows what a request does; it only runs it and bounds the wait.

use std::future::Future;
use std::io;
use std::sync::mpsc;
use std::time::Duration;

use tokio::runtime::{Builder, Runtime};

/// How many worker threads the runtime has: requests are few and large, and
/// the machine's cores belong to the job.
const WORKER_THREADS: usize = 2;

/// The longest a caller waits for one request, retries included. The
/// object store's own timeouts and bounded retries end every request well
/// before; this only guards against a request that never ends.
pub(crate) const REQUEST_DEADLINE: Duration = Duration::from_secs(300);

/// A runtime of the store's own, shut down in the background when dropped
/// (dropping a runtime inside another runtime's thread would panic).
pub(crate) struct Bridge {
    runtime: Option<Runtime>,
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Bridge")
            .field("workers", &WORKER_THREADS)
            .finish()
    }
}

impl Bridge {
    /// Starts the runtime's threads.
    pub(crate) fn new() -> io::Result<Self> {
        let runtime = Builder::new_multi_thread()
            .worker_threads(WORKER_THREADS)
            .thread_name("snapflow-object-store")
            .enable_all()
            .build()?;
        Ok(Self {
            runtime: Some(runtime),
        })
    }

    /// Runs `future` on the store's runtime and waits for its output, at
    /// most [`REQUEST_DEADLINE`].
    pub(crate) fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> io::Result<T> {
        let runtime = self
            .runtime
            .as_ref()
            .ok_or_else(|| io::Error::other("the object store's runtime was shut down"))?;
        let (sender, receiver) = mpsc::sync_channel(1);
        let task = runtime.spawn(async move {
            // The receiver is gone only after a timeout; nothing to tell.
            let _ = sender.send(future.await);
        });
        match receiver.recv_timeout(REQUEST_DEADLINE) {
            Ok(output) => Ok(output),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                task.abort();
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "an object store request took longer than {} s",
                        REQUEST_DEADLINE.as_secs()
                    ),
                ))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(io::Error::other(
                "an object store request ended without a result (its task panicked)",
            )),
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Bridge;

    /// A request runs from inside another tokio runtime (as from an actix
    /// thread) without the panic of a nested `block_on`, and the bridge
    /// can be dropped there too.
    #[test]
    fn runs_from_inside_another_runtime() {
        let outer = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let answer = outer.block_on(async {
            let bridge = Bridge::new().expect("a bridge");
            let answer = bridge.run(async { 6 * 7 }).expect("runs");
            drop(bridge);
            answer
        });
        assert_eq!(answer, 42);
    }
}
