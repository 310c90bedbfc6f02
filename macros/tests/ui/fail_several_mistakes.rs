// Every mistake in one derive is reported at once, each at its own token.
use snapflow::Snapshot;

#[derive(Snapshot)]
#[snapshot(version = 0, colour = "red")]
struct Counter {
    #[snapshot(nested, skip)]
    count: u64,
    #[snapshot(default = make)]
    seen: Vec<u64>,
}

fn main() {}
