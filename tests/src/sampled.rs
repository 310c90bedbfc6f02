//! Running a job to its end while sampling its live metrics, for tests
//! that check what the metrics showed on the way (a lag above 0, say) as
//! well as at the end.
//!
//! This module owns the sampling thread and its bound; it never asserts
//! anything about the figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use snapflow::job::RunningJob;
use snapflow::metrics::JobMetrics;

/// What [`run_sampled`] saw.
pub struct Sampled {
    /// A snapshot every 10 ms while the job ran.
    pub during: Vec<JobMetrics>,
    /// The snapshot after the job ended.
    pub last: JobMetrics,
}

/// Waits for `running` to end, taking a metrics snapshot every 10 ms
/// meanwhile (for at most `limit`, should the job never end: the bound
/// of the samples), and once after.
///
/// # Panics
///
/// When the job fails or the sampling thread panics.
pub fn run_sampled(running: RunningJob, limit: Duration) -> Sampled {
    let registry = running.metrics_registry();
    let ended = Arc::new(AtomicBool::new(false));
    let sampler = {
        let registry = Arc::clone(&registry);
        let ended = Arc::clone(&ended);
        thread::spawn(move || {
            let mut during = Vec::new();
            let deadline = Instant::now() + limit;
            while !ended.load(Ordering::Acquire) && Instant::now() < deadline {
                during.push(registry.snapshot());
                thread::sleep(Duration::from_millis(10));
            }
            during
        })
    };
    let report = running.wait();
    ended.store(true, Ordering::Release);
    report.expect("the job runs");
    let during = sampler.join().expect("the sampler ran");
    Sampled {
        during,
        last: registry.snapshot(),
    }
}
