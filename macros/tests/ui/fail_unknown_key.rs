use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(verison = 2)]
struct Counter {
    count: u64,
}

fn main() {}
