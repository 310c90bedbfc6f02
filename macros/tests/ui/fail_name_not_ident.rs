use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(name = "Counter v1")]
struct CounterV1 {
    count: u64,
}

fn main() {}
