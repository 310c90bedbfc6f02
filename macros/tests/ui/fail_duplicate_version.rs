use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(version = 2)]
#[snapshot(version = 3)]
struct Counter {
    count: u64,
}

fn main() {}
