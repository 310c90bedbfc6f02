use snapflow::Snapshot;

#[derive(Snapshot)]
struct Counter {
    #[snapshot(version = 2)]
    count: u64,
}

fn main() {}
