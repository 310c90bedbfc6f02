use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(name = "Counter")]
struct CounterV1 {
    count: u32,
}

#[derive(Snapshot)]
#[snapshot(version = 2, upgrade_from = CounterV1)]
struct Counter {
    count: u64,
}

fn main() {}
