use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(name = "Counter")]
struct CounterV1 {
    count: u32,
}

#[derive(Snapshot)]
#[snapshot(upgrade_from = CounterV1)]
struct Counter {
    count: u64,
}

impl From<CounterV1> for Counter {
    fn from(old: CounterV1) -> Self {
        Counter { count: old.count.into() }
    }
}

fn main() {}
