//! Fixtures shared by the keyed-state unit tests (the in-memory backend,
//! the spilling backend, incremental checkpoints). Compiled for tests
//! only; it owns no behaviour.

/// A per-key count, the state the unit tests keep.
#[derive(crate::Snapshot, Default, Debug, Clone, PartialEq)]
#[snapshot(crate = "crate")]
pub(crate) struct Count {
    /// How many times the key was seen (or whatever the test adds).
    pub(crate) count: u64,
}

/// `SNAPFLOW_SEED` replays a randomised test's run; otherwise a fresh
/// seed (each test prints it when it fails).
pub(crate) fn seed() -> u64 {
    match std::env::var("SNAPFLOW_SEED") {
        Ok(text) => text.parse().expect("SNAPFLOW_SEED must be a u64"),
        Err(_) => rand::random(),
    }
}

/// Runs `check` with a fresh seed (or `SNAPFLOW_SEED`) and, if it
/// panics, fails naming the seed that replays it.
pub(crate) fn with_seed(name: &str, check: impl Fn(u64) + std::panic::RefUnwindSafe) {
    let seed = seed();
    if std::panic::catch_unwind(|| check(seed)).is_err() {
        panic!("{name} failed; replay with SNAPFLOW_SEED={seed}");
    }
}

/// splitmix64: enough randomness for a workload, and replayable.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `bound` (which must not be 0).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}
