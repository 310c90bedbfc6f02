use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(version = "2")]
struct Counter {
    count: u64,
}

fn main() {}
