use snapflow::Snapshot;

struct Opaque;

#[derive(Snapshot)]
struct Counter {
    count: u64,
    handle: Opaque,
}

fn main() {}
