//! One-behaviour tests of `ConcurrentMachine`'s contract: each case is a
//! script of inputs to one node and the exact actions it must produce, in
//! order. Tokens are handed back at once unless the case holds them until a
//! `Recorded` step. Misuse by the driver must be an assertion naming the
//! channel and the snapshot.

use snapflow::protocol::{
    ConcurrentAction, ConcurrentConfig, ConcurrentConfigError, ConcurrentDeclineReason,
    ConcurrentMachine, ConcurrentToken, SnapshotId,
};

/// One input to the machine.
#[derive(Debug, Clone, Copy)]
enum In {
    Data(usize, &'static str),
    Marker(usize, SnapshotId),
    End(usize),
    Start,
    /// Hand back the held token of this snapshot.
    Recorded(SnapshotId),
}

use In::{Data, End, Marker, Recorded, Start};

const fn s(initiator: usize, sequence: u64) -> SnapshotId {
    SnapshotId {
        initiator,
        sequence,
    }
}

const A: SnapshotId = s(0, 0);
const C: SnapshotId = s(2, 0);

struct Driver {
    machine: ConcurrentMachine<&'static str>,
    hold_tokens: bool,
    held: Vec<ConcurrentToken>,
    log: Vec<String>,
}

impl Driver {
    fn new(node: usize, inputs: usize, bound: usize, hold_tokens: bool) -> Driver {
        let config = ConcurrentConfig::new(node, inputs).with_max_concurrent(bound);
        Driver {
            machine: ConcurrentMachine::new(config).expect("valid config"),
            hold_tokens,
            held: Vec::new(),
            log: Vec::new(),
        }
    }

    fn input(&mut self, input: In) {
        match input {
            Data(channel, message) => self.machine.on_data(channel, &message),
            Marker(channel, id) => self.machine.on_marker(channel, id),
            End(channel) => self.machine.on_end_of_input(channel),
            Start => {
                let id = self.machine.start_snapshot();
                self.log
                    .push(format!("start {}/{}", id.initiator, id.sequence));
            }
            Recorded(id) => {
                let index = self
                    .held
                    .iter()
                    .position(|token| token.snapshot() == id)
                    .expect("the script holds this token");
                let token = self.held.remove(index);
                self.machine.state_recorded(token);
            }
        }
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(action) = self.machine.poll_action() {
            let line = self.describe(action);
            self.log.push(line);
        }
    }

    fn describe(&mut self, action: ConcurrentAction<&'static str>) -> String {
        let name = |id: SnapshotId| format!("{}/{}", id.initiator, id.sequence);
        match action {
            ConcurrentAction::TakeSnapshot(token) => {
                let line = format!("take {}", name(token.snapshot()));
                if self.hold_tokens {
                    self.held.push(token);
                } else {
                    self.machine.state_recorded(token);
                }
                line
            }
            ConcurrentAction::EmitMarker(id) => format!("emit {}", name(id)),
            ConcurrentAction::ReportPart(part) => {
                let channels: Vec<String> = part
                    .channel_states
                    .iter()
                    .enumerate()
                    .map(|(index, state)| {
                        assert_eq!(state.channel, index, "channel states in channel order");
                        state.messages.join(",")
                    })
                    .collect();
                format!("report {} [{}]", name(part.snapshot), channels.join("|"))
            }
            ConcurrentAction::Decline { snapshot, reason } => {
                let ConcurrentDeclineReason::TooManyConcurrent { max_concurrent } = reason;
                format!("decline {} max {max_concurrent}", name(snapshot))
            }
        }
    }
}

/// Runs `script` at node `node` with `inputs` inputs and a bound of `bound`,
/// handing tokens back at once, and checks the actions.
fn check(node: usize, inputs: usize, bound: usize, script: &[In], want: &[&str]) {
    check_tokens(node, inputs, bound, false, script, want);
}

/// [`check`], holding tokens until the script's `Recorded` steps.
fn check_held(node: usize, inputs: usize, script: &[In], want: &[&str]) {
    check_tokens(node, inputs, 4, true, script, want);
}

fn check_tokens(
    node: usize,
    inputs: usize,
    bound: usize,
    hold_tokens: bool,
    script: &[In],
    want: &[&str],
) -> Driver {
    let mut driver = Driver::new(node, inputs, bound, hold_tokens);
    for &input in script {
        driver.input(input);
    }
    assert_eq!(driver.log, want, "script: {script:?}");
    driver
}

#[test]
fn data_with_no_snapshot_in_flight_is_not_recorded() {
    let driver = check_tokens(1, 2, 4, false, &[Data(0, "x"), Data(1, "y")], &[]);
    assert!(driver.machine.is_idle());
    assert_eq!(driver.machine.recorded_len(), 0);
}
#[test]
fn first_marker_takes_the_state_then_emits_markers() {
    check(1, 2, 4, &[Marker(0, A)], &["take 0/0", "emit 0/0"]);
}
#[test]
fn an_input_is_recorded_until_its_marker_and_not_after() {
    let script = [
        Marker(0, A),
        Data(1, "x"),
        Data(0, "y"),
        Marker(1, A),
        Data(1, "z"),
    ];
    check(
        1,
        2,
        4,
        &script,
        &["take 0/0", "emit 0/0", "report 0/0 [|x]"],
    );
}
#[test]
fn data_before_the_first_marker_is_in_the_local_state_not_recorded() {
    let script = [Data(1, "x"), Marker(0, A), Marker(1, A)];
    check(
        1,
        2,
        4,
        &script,
        &["take 0/0", "emit 0/0", "report 0/0 [|]"],
    );
}
#[test]
fn crossing_markers_of_two_snapshots_record_independently() {
    let script = [Marker(0, A), Marker(1, C), Data(0, "x"), Data(1, "y")];
    let script = [&script[..], &[Marker(1, A), Marker(0, C)]].concat();
    let want = ["take 0/0", "emit 0/0", "take 2/0", "emit 2/0"];
    let want = [&want[..], &["report 0/0 [|y]", "report 2/0 [x|]"]].concat();
    check(1, 2, 4, &script, &want);
}
#[test]
fn one_message_is_recorded_once_per_snapshot_that_records_its_channel() {
    let driver = check_tokens(
        1,
        2,
        4,
        false,
        &[Marker(0, A), Marker(0, C), Data(1, "x")],
        &["take 0/0", "emit 0/0", "take 2/0", "emit 2/0"],
    );
    assert_eq!(driver.machine.recorded_len(), 2);
    let in_flight: Vec<_> = driver.machine.snapshots_in_flight().collect();
    assert_eq!(in_flight, vec![A, C]);
}
#[test]
fn a_local_start_records_every_input_until_its_own_marker_returns() {
    let script = [Start, Data(0, "x"), Marker(0, s(1, 0))];
    check(
        1,
        1,
        4,
        &script,
        &["start 1/0", "take 1/0", "emit 1/0", "report 1/0 [x]"],
    );
}
#[test]
fn a_node_without_inputs_reports_as_soon_as_its_state_is_recorded() {
    check(
        0,
        0,
        4,
        &[Start],
        &["start 0/0", "take 0/0", "emit 0/0", "report 0/0 []"],
    );
}
#[test]
fn local_starts_number_their_snapshots_in_order() {
    let want = ["start 0/0", "take 0/0", "emit 0/0", "report 0/0 []"];
    let more = ["start 0/1", "take 0/1", "emit 0/1", "report 0/1 []"];
    check(0, 0, 4, &[Start, Start], &[&want[..], &more[..]].concat());
}
#[test]
fn the_first_sequence_is_configurable() {
    let config = ConcurrentConfig::new(3, 0).with_first_sequence(7);
    let mut machine: ConcurrentMachine<u8> = ConcurrentMachine::new(config).unwrap();
    assert_eq!(machine.start_snapshot(), s(3, 7));
    assert_eq!(machine.next_sequence(), 8);
}
#[test]
fn the_report_waits_for_the_token() {
    let script = [Marker(0, A), Marker(1, A), Recorded(A)];
    check_held(1, 2, &script, &["take 0/0", "emit 0/0", "report 0/0 [|]"]);
}
#[test]
fn a_held_token_keeps_the_recording_done_but_the_part_unreported() {
    let script = [Marker(0, A), Data(1, "x"), Marker(1, A), Data(1, "y")];
    let driver = check_tokens(1, 2, 4, true, &script, &["take 0/0", "emit 0/0"]);
    assert_eq!(driver.machine.recorded_len(), 1);
}
#[test]
fn end_of_input_counts_as_the_marker_of_snapshots_in_flight() {
    let script = [Marker(0, A), Data(1, "x"), End(1)];
    check(
        1,
        2,
        4,
        &script,
        &["take 0/0", "emit 0/0", "report 0/0 [|x]"],
    );
}
#[test]
fn end_of_input_counts_as_the_marker_of_later_snapshots() {
    check(
        1,
        2,
        4,
        &[End(1), Marker(0, A)],
        &["take 0/0", "emit 0/0", "report 0/0 [|]"],
    );
}
#[test]
fn a_marker_over_the_bound_is_declined_and_still_sent_on() {
    let script = [Marker(0, A), Marker(1, C)];
    let want = ["take 0/0", "emit 0/0", "decline 2/0 max 1", "emit 2/0"];
    let driver = check_tokens(1, 2, 1, false, &script, &want);
    let declined: Vec<_> = driver.machine.declined_in_flight().collect();
    assert_eq!(declined, vec![C]);
}
#[test]
fn later_markers_of_a_declined_snapshot_are_not_a_new_start() {
    let script = [Marker(0, A), Marker(1, C), Marker(0, C), Marker(1, A)];
    let want = [
        "take 0/0",
        "emit 0/0",
        "decline 2/0 max 1",
        "emit 2/0",
        "report 0/0 [|]",
    ];
    let driver = check_tokens(1, 2, 1, false, &script, &want);
    assert!(driver.machine.is_idle());
}
#[test]
fn a_declined_snapshot_does_not_count_against_the_bound() {
    let d = s(3, 0);
    let script = [Marker(0, A), Marker(1, C), Marker(1, A), Marker(1, d)];
    let want = [
        "take 0/0",
        "emit 0/0",
        "decline 2/0 max 1",
        "emit 2/0",
        "report 0/0 [|]",
    ];
    check(
        1,
        2,
        1,
        &script,
        &[&want[..], &["take 3/0", "emit 3/0"]].concat(),
    );
}
#[test]
fn a_local_start_over_the_bound_is_declined_and_sends_nothing() {
    let want = ["take 0/0", "emit 0/0", "start 1/0", "decline 1/0 max 1"];
    let driver = check_tokens(1, 2, 1, false, &[Marker(0, A), Start], &want);
    assert_eq!(driver.machine.next_sequence(), 1);
}
#[test]
fn a_zero_bound_is_a_config_error() {
    let config = ConcurrentConfig::new(0, 1).with_max_concurrent(0);
    let error = ConcurrentMachine::<u8>::new(config).unwrap_err();
    assert_eq!(error, ConcurrentConfigError::ZeroConcurrency);
}
#[test]
#[should_panic(expected = "marker of snapshot 0/0 arrived twice on input channel 0")]
fn a_marker_twice_on_a_channel_is_misuse() {
    check(1, 2, 4, &[Marker(0, A), Marker(0, A)], &[]);
}
#[test]
#[should_panic(expected = "marker of snapshot 0/0 arrived twice on input channel 1")]
fn a_marker_of_a_finished_snapshot_is_misuse() {
    check(1, 2, 4, &[Marker(0, A), Marker(1, A), Marker(1, A)], &[]);
}
#[test]
#[should_panic(
    expected = "marker of snapshot 0/0 on input channel 0 after the marker of snapshot 0/1"
)]
fn markers_of_one_initiator_out_of_order_are_misuse() {
    check(1, 2, 4, &[Marker(0, s(0, 1)), Marker(0, A)], &[]);
}
#[test]
#[should_panic(expected = "marker of snapshot 0/0 on input channel 1 after its end of input")]
fn a_marker_after_end_of_input_is_misuse() {
    check(1, 2, 4, &[End(1), Marker(1, A)], &[]);
}
#[test]
#[should_panic(
    expected = "marker of snapshot 1/0 on input channel 0, a snapshot of this node that it never started"
)]
fn a_marker_of_an_own_snapshot_never_started_is_misuse() {
    check(1, 1, 4, &[Marker(0, s(1, 0))], &[]);
}
#[test]
#[should_panic(expected = "end of input arrived twice on input channel 0")]
fn end_of_input_twice_is_misuse() {
    check(1, 1, 4, &[End(0), End(0)], &[]);
}
#[test]
#[should_panic(expected = "data message on input channel 1 after its end of input")]
fn data_after_end_of_input_is_misuse() {
    check(1, 3, 4, &[Marker(0, A), End(1), Data(1, "x")], &[]);
}
#[test]
#[should_panic(expected = "drain ConcurrentMachine::poll_action before the next input")]
fn an_input_before_the_actions_are_drained_is_misuse() {
    let mut machine: ConcurrentMachine<u8> =
        ConcurrentMachine::new(ConcurrentConfig::new(1, 2)).unwrap();
    machine.on_marker(0, A);
    machine.on_marker(1, C);
}
#[test]
#[should_panic(
    expected = "snapshot token of snapshot 0/0 handed back, but this node has no such snapshot"
)]
fn a_token_handed_to_another_node_is_misuse() {
    let mut first: ConcurrentMachine<u8> =
        ConcurrentMachine::new(ConcurrentConfig::new(0, 0)).unwrap();
    let mut second: ConcurrentMachine<u8> =
        ConcurrentMachine::new(ConcurrentConfig::new(1, 0)).unwrap();
    let _id = first.start_snapshot();
    let Some(ConcurrentAction::TakeSnapshot(token)) = first.poll_action() else {
        panic!("a start takes the state first");
    };
    second.state_recorded(token);
}
