use snapflow::Snapshot;

fn seven() -> u64 {
    7
}

#[derive(Snapshot)]
struct Counter {
    #[snapshot(default = seven)]
    count: u64,
}

fn main() {}
