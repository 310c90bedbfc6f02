use snapflow::Snapshot;

#[derive(Snapshot)]
struct Counter {
    count: u64,
    #[snapshot(skip = true)]
    cache: Vec<u64>,
}

fn main() {}
