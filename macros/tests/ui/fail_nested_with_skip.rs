use snapflow::Snapshot;

#[derive(Snapshot, Default)]
struct Inner {
    total: u64,
}

#[derive(Snapshot)]
struct Outer {
    #[snapshot(skip, nested)]
    inner: Inner,
}

fn main() {}
