use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(version = 0)]
struct Counter {
    count: u64,
}

fn main() {}
