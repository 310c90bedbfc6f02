//! The bank: N accounts pass tokens at random over a complete graph; the
//! sum of every completed snapshot (account balances plus tokens recorded in
//! channel states) must equal the initial total. The simulator checks the
//! sum at every completion; these tests make sure many completions, with
//! tokens really in flight, were checked.

use snapflow::protocol::SnapshotMode;

use crate::random::{check_many, CasePlan, Shape};

fn check(label: &str, mode: SnapshotMode, accounts: usize, base: u64) {
    let plan = CasePlan {
        shape: Shape::Complete,
        nodes: (accounts, accounts),
        steps: 2_000,
        sends: (200, 400),
        mode: Some(mode),
    };
    let outcome = check_many(label, &plan, 200, base);
    assert!(
        outcome.completed >= 200,
        "too few snapshots checked: {outcome:?}"
    );
    assert!(
        outcome.recorded_messages > 0,
        "no snapshot had tokens in flight: {outcome:?}"
    );
}

#[test]
fn bank_unaligned_five_accounts() {
    check(
        "bank_unaligned_five_accounts",
        SnapshotMode::Unaligned,
        5,
        10_000_000,
    );
}
#[test]
fn bank_cyclic_five_accounts() {
    check(
        "bank_cyclic_five_accounts",
        SnapshotMode::Cyclic,
        5,
        11_000_000,
    );
}
#[test]
fn bank_unaligned_eight_accounts() {
    check(
        "bank_unaligned_eight_accounts",
        SnapshotMode::Unaligned,
        8,
        12_000_000,
    );
}
