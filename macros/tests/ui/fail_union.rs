use snapflow::Snapshot;

#[derive(Snapshot)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
