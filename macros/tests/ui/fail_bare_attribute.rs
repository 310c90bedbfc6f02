use snapflow::Snapshot;

#[derive(Snapshot)]
struct Counter {
    #[snapshot]
    count: u64,
}

fn main() {}
