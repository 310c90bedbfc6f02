use snapflow::Snapshot;

#[derive(Snapshot)]
struct Outer {
    #[snapshot(nested)]
    inner: Vec<u64>,
}

fn main() {}
