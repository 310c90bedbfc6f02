use snapflow::Snapshot;

#[derive(Snapshot)]
enum Phase {
    Idle,
    #[snapshot(version = 2)]
    Running(u64),
}

fn main() {}
