use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(crate = "not a path")]
struct Counter {
    count: u64,
}

fn main() {}
