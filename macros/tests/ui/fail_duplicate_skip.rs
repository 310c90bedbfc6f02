use snapflow::Snapshot;

#[derive(Snapshot)]
struct Counter {
    count: u64,
    #[snapshot(skip, skip)]
    cache: Vec<u64>,
}

fn main() {}
