//! Placeholder main example.
fn main() {}
