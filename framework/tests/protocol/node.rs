//! The node machine's contract, one behaviour per test: the hot path, the
//! hold-and-release of aligned channels, recording, aborts, late barriers,
//! end of input, concurrency, declines, self-loops, and misuse assertions.

use snapflow::protocol::graph::GraphBuilder;
use snapflow::protocol::ChannelPolicy::{Align, AlignNoHold, Record};
use snapflow::protocol::{
    ChannelPolicy, ChannelState, CheckpointId, DeclineReason, Delivery, NodeAction, NodeConfig,
    NodeConfigError, NodeMachine, NodePart, SnapshotMode,
};

const ONE: CheckpointId = CheckpointId(1);
const TWO: CheckpointId = CheckpointId(2);

/// The actions, with tokens handed back at once and shown as `Snapshot(n)`.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Process(usize, u32),
    Snapshot(CheckpointId),
    Barrier(CheckpointId),
    Report(NodePart<u32>),
    Decline(CheckpointId, DeclineReason),
}

fn machine(policies: &[ChannelPolicy]) -> NodeMachine<u32> {
    NodeMachine::new(NodeConfig::new(policies.to_vec())).expect("valid config")
}

fn drain(node: &mut NodeMachine<u32>) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Some(action) = node.poll_action() {
        seen.push(match action {
            NodeAction::Process { channel, message } => Seen::Process(channel, message),
            NodeAction::TakeSnapshot(token) => {
                let checkpoint = token.checkpoint();
                assert!(node.state_recorded(token));
                Seen::Snapshot(checkpoint)
            }
            NodeAction::EmitBarrier(checkpoint) => Seen::Barrier(checkpoint),
            NodeAction::ReportPart(part) => Seen::Report(part),
            NodeAction::Decline { checkpoint, reason } => Seen::Decline(checkpoint, reason),
        });
    }
    seen
}

fn report(checkpoint: CheckpointId, states: &[(usize, &[u32])]) -> Seen {
    let channel_states = states
        .iter()
        .map(|(channel, messages)| ChannelState {
            channel: *channel,
            messages: messages.to_vec(),
        })
        .collect();
    Seen::Report(NodePart {
        checkpoint,
        channel_states,
    })
}

#[test]
fn data_without_a_checkpoint_is_processed_at_once() {
    let mut node = machine(&[Align, Align]);
    assert_eq!(node.on_data(0, 7), Delivery::Process(7));
    assert!(drain(&mut node).is_empty());
}

#[test]
fn aligned_channel_is_held_until_the_snapshot_then_released_in_order() {
    let mut node = machine(&[Align, Align]);
    node.on_barrier(0, ONE);
    assert!(drain(&mut node).is_empty());
    assert_eq!(node.on_data(0, 1), Delivery::Held);
    assert_eq!(node.on_data(0, 2), Delivery::Held);
    assert_eq!(node.on_data(1, 3), Delivery::Process(3));
    node.on_barrier(1, ONE);
    let want = vec![
        Seen::Snapshot(ONE),
        Seen::Barrier(ONE),
        Seen::Process(0, 1),
        Seen::Process(0, 2),
        report(ONE, &[]),
    ];
    assert_eq!(drain(&mut node), want);
}

#[test]
fn record_channel_is_recorded_after_the_snapshot_until_its_barrier() {
    let mut node = machine(&[Record, Record]);
    node.on_barrier(0, ONE);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE)]
    );
    assert_eq!(node.on_data(1, 5), Delivery::Process(5));
    assert_eq!(
        node.on_data(0, 6),
        Delivery::Process(6),
        "channel 0 delivered its barrier"
    );
    node.on_barrier(1, ONE);
    assert_eq!(drain(&mut node), vec![report(ONE, &[(0, &[]), (1, &[5])])]);
}

#[test]
fn at_least_once_channel_is_never_held() {
    let mut node = machine(&[AlignNoHold, AlignNoHold]);
    node.on_barrier(0, ONE);
    assert_eq!(node.on_data(0, 1), Delivery::Process(1));
    node.on_barrier(1, ONE);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE), report(ONE, &[])]
    );
}

#[test]
fn abort_releases_held_messages_and_a_late_barrier_is_harmless() {
    let mut node = machine(&[Align, Align]);
    node.on_barrier(0, ONE);
    assert_eq!(node.on_data(0, 1), Delivery::Held);
    node.on_abort(ONE);
    assert_eq!(drain(&mut node), vec![Seen::Process(0, 1)]);
    node.on_barrier(1, ONE);
    assert!(drain(&mut node).is_empty());
    assert!(!node.has_checkpoint_in_flight());
    assert_eq!(node.on_data(1, 2), Delivery::Process(2));
}

#[test]
fn abort_drops_partial_records() {
    let mut node = machine(&[Record, Record]);
    node.on_barrier(0, ONE);
    drain(&mut node);
    assert_eq!(node.on_data(1, 5), Delivery::Process(5));
    node.on_abort(ONE);
    node.on_barrier(1, ONE);
    assert!(
        drain(&mut node).is_empty(),
        "no report of an aborted checkpoint"
    );
}

#[test]
fn end_of_input_counts_as_every_later_barrier() {
    let mut node = machine(&[Align, Align]);
    node.on_end_of_input(1);
    node.on_barrier(0, ONE);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE), report(ONE, &[])]
    );
}

#[test]
fn end_of_input_of_the_last_missing_channel_snapshots() {
    let mut node = machine(&[Align, Align]);
    node.on_barrier(0, ONE);
    node.on_end_of_input(1);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE), report(ONE, &[])]
    );
}

#[test]
fn a_held_barrier_of_the_next_checkpoint_is_replayed_after_release() {
    let config = NodeConfig::new(vec![Align, Align]).with_max_concurrent(2);
    let mut node: NodeMachine<u32> = NodeMachine::new(config).unwrap();
    node.on_barrier(0, ONE);
    assert_eq!(node.on_data(0, 1), Delivery::Held);
    node.on_barrier(0, TWO);
    assert_eq!(node.on_data(0, 2), Delivery::Held);
    node.on_barrier(1, ONE);
    let want = vec![
        Seen::Snapshot(ONE),
        Seen::Barrier(ONE),
        Seen::Process(0, 1),
        report(ONE, &[]),
    ];
    assert_eq!(drain(&mut node), want);
    assert!(
        node.is_held(0),
        "held again for checkpoint 2, message 2 still buffered"
    );
    assert_eq!(node.held_len(0), 1);
    node.on_barrier(1, TWO);
    assert_eq!(
        drain(&mut node),
        vec![
            Seen::Snapshot(TWO),
            Seen::Barrier(TWO),
            Seen::Process(0, 2),
            report(TWO, &[])
        ]
    );
}

#[test]
fn a_newer_barrier_overtaking_declines_the_older_checkpoint() {
    let config = NodeConfig::new(vec![Align, Align]).with_max_concurrent(2);
    let mut node: NodeMachine<u32> = NodeMachine::new(config).unwrap();
    node.on_barrier(0, ONE);
    node.on_barrier(1, TWO);
    let seen = drain(&mut node);
    assert_eq!(seen[0], Seen::Decline(ONE, DeclineReason::BarrierOvertaken));
}

#[test]
fn starting_one_more_than_max_concurrent_declines_the_oldest() {
    let mut node = machine(&[Align, Align]);
    node.on_barrier(0, ONE);
    node.on_barrier(0, TWO);
    assert!(
        drain(&mut node).is_empty(),
        "barrier 2 is buffered behind the held channel"
    );
    node.on_abort(ONE);
    assert!(
        drain(&mut node).is_empty(),
        "2 is now waiting for channel 1"
    );
    node.on_barrier(1, TWO);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(TWO), Seen::Barrier(TWO), report(TWO, &[])]
    );
    let mut node = machine(&[Record]);
    node.on_barrier(0, ONE);
    drain(&mut node);
    let source = NodeConfig::source();
    let mut initiator: NodeMachine<u32> = NodeMachine::new(source).unwrap();
    initiator.on_trigger(ONE);
    let Some(NodeAction::TakeSnapshot(_token)) = initiator.poll_action() else {
        panic!("snapshot")
    };
    drain(&mut initiator);
    initiator.on_trigger(TWO);
    assert_eq!(
        drain(&mut initiator)[0],
        Seen::Decline(ONE, DeclineReason::Subsumed)
    );
}

#[test]
fn a_token_handed_back_after_an_abort_is_ignored() {
    let mut node: NodeMachine<u32> = NodeMachine::new(NodeConfig::source()).unwrap();
    node.on_trigger(ONE);
    let Some(NodeAction::TakeSnapshot(token)) = node.poll_action() else {
        panic!("snapshot")
    };
    drain(&mut node);
    node.on_abort(ONE);
    assert!(!node.state_recorded(token));
    assert!(drain(&mut node).is_empty());
}

#[test]
fn initiator_with_an_aligned_input_is_a_config_error() {
    let config = NodeConfig::new(vec![Record, Align]).with_initiator(true);
    let error = NodeMachine::<u32>::new(config).unwrap_err();
    assert_eq!(
        error,
        NodeConfigError::InitiatorWithAlignedInput {
            channel: 1,
            policy: Align
        }
    );
    assert!(!error.is_retryable());
}

/// The planned config of the node `a` of a 2-cycle `a <-> b` with a
/// self-loop `a -> a`, initiator `a`, in `mode`.
fn self_loop_initiator(mode: SnapshotMode) -> NodeConfig {
    let graph = GraphBuilder::new()
        .node("a")
        .node("b")
        .edge("a", "b")
        .edge("b", "a")
        .edge("a", "a")
        .build()
        .expect("valid graph");
    let plan = graph.plan(mode, &["a"]).expect("plannable");
    let a = graph.find("a").expect("a exists");
    plan.node_config(a, 1)
}

#[test]
fn a_self_loop_is_a_recorded_back_edge_in_every_cycle_mode() {
    for mode in [SnapshotMode::Cyclic, SnapshotMode::Unaligned] {
        let config = self_loop_initiator(mode);
        // Channel 0 is `b -> a`, channel 1 the self-loop `a -> a`.
        assert_eq!(config.policies, vec![Record, Record], "{mode:?}");
        assert_eq!(config.feedback, vec![true, true], "{mode:?}");
        assert!(config.initiator, "{mode:?}");
    }
}

#[test]
fn an_initiator_records_its_self_loop_until_its_own_barrier_comes_back() {
    let config = self_loop_initiator(SnapshotMode::Cyclic);
    let mut node: NodeMachine<u32> = NodeMachine::new(config).expect("valid config");
    node.on_trigger(ONE);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE)]
    );
    // The message it sent itself before the snapshot, ahead of its barrier.
    assert_eq!(node.on_data(1, 2), Delivery::Process(2));
    node.on_barrier(1, ONE); // Its own barrier closes the self-loop.
    assert!(drain(&mut node).is_empty(), "channel 0 is still open");
    assert_eq!(node.on_data(1, 3), Delivery::Process(3), "after the cut");
    assert_eq!(node.on_data(0, 5), Delivery::Process(5));
    node.on_barrier(0, ONE);
    assert_eq!(drain(&mut node), vec![report(ONE, &[(0, &[5]), (1, &[2])])]);
}

#[test]
fn needs_trigger_once_every_forward_input_ended() {
    let config = NodeConfig::new(vec![Align, Record]).with_feedback(vec![false, true]);
    let mut node: NodeMachine<u32> = NodeMachine::new(config).unwrap();
    assert!(!node.needs_trigger());
    node.on_end_of_input(0);
    assert!(node.needs_trigger());
    node.on_trigger(ONE);
    assert_eq!(
        drain(&mut node),
        vec![Seen::Snapshot(ONE), Seen::Barrier(ONE)]
    );
}

#[test]
#[should_panic(expected = "barrier of checkpoint 1 arrived twice on input channel 0")]
fn the_same_barrier_twice_is_a_driver_bug() {
    let mut node = machine(&[Align, Align]);
    node.on_barrier(0, ONE);
    node.on_barrier(0, ONE);
}

#[test]
#[should_panic(expected = "is not newer than the last completed checkpoint 2")]
fn a_barrier_older_than_the_last_completed_is_a_driver_bug() {
    let config = NodeConfig::new(vec![Align]);
    let mut node: NodeMachine<u32> = NodeMachine::resumed(config, TWO).unwrap();
    node.on_barrier(0, ONE);
}

#[test]
#[should_panic(expected = "drain NodeMachine::poll_action before the next input")]
fn an_input_before_draining_is_a_driver_bug() {
    let mut node = machine(&[Align]);
    node.on_barrier(0, ONE);
    node.on_barrier(0, TWO);
}

#[test]
#[should_panic(expected = "not an initiator")]
fn a_trigger_at_an_aligned_non_initiator_is_a_driver_bug() {
    let mut node = machine(&[Align]);
    node.on_trigger(ONE);
}
