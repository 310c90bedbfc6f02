use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(skip)]
struct Counter {
    count: u64,
}

fn main() {}
