//! The global snapshot value: one node's state, one channel's recorded
//! messages, one source's position, and their assembly from the node
//! parts of one checkpoint into a [`GlobalSnapshot`] that the storage
//! layer persists.
//!
//! It checks that every node of the graph gave exactly one part; it never
//! plans, runs or persists anything ([`super::graph`] owns the graph and
//! its plan).

use serde::{Deserialize, Serialize};

use super::graph::LogicalGraph;
use super::node::NodePart;
use super::CheckpointId;

/// One node's local state in a global snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeEntry<S> {
    /// The node's name (stable across job versions, unlike its id).
    pub node: String,
    /// Its state (or the handle of its stored state blob).
    pub state: S,
}

/// One channel's recorded in-flight messages in a global snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelEntry<M> {
    /// The edge id.
    pub edge: usize,
    /// The sender's name.
    pub from: String,
    /// The receiver's name.
    pub to: String,
    /// The messages, oldest first; delivered before any new input on
    /// restore.
    pub messages: Vec<M>,
}

/// One source's read position in a global snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceEntry<P> {
    /// The source's name.
    pub node: String,
    /// Where it resumes reading.
    pub position: P,
}

/// A complete, consistent global snapshot: what the store persists for one
/// checkpoint. `S` is a node's state (or a handle to its blob), `M` a
/// channel-state message, `P` a source position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobalSnapshot<S, M, P> {
    /// The checkpoint.
    pub checkpoint: CheckpointId,
    /// Every node's state, in node order.
    pub nodes: Vec<NodeEntry<S>>,
    /// Every RECORD channel's state (possibly empty), by edge id.
    pub channels: Vec<ChannelEntry<M>>,
    /// Every source's position, in node order.
    pub source_positions: Vec<SourceEntry<P>>,
}

/// One part of a [`GlobalSnapshot`], as listed by [`GlobalSnapshot::parts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotPart<'a, S, M, P> {
    /// A node's state.
    NodeState(&'a NodeEntry<S>),
    /// A channel's recorded messages.
    ChannelState(&'a ChannelEntry<M>),
    /// A source's position.
    SourcePosition(&'a SourceEntry<P>),
}

impl<S, M, P> GlobalSnapshot<S, M, P> {
    /// Every part: node states, then channel states, then source positions.
    pub fn parts(&self) -> impl Iterator<Item = SnapshotPart<'_, S, M, P>> {
        let nodes = self.nodes.iter().map(SnapshotPart::NodeState);
        let channels = self.channels.iter().map(SnapshotPart::ChannelState);
        let sources = self
            .source_positions
            .iter()
            .map(SnapshotPart::SourcePosition);
        nodes.chain(channels).chain(sources)
    }

    /// The number of recorded in-flight messages over all channels.
    pub fn channel_message_count(&self) -> usize {
        self.channels
            .iter()
            .map(|channel| channel.messages.len())
            .sum()
    }

    /// Assembles the global snapshot of `checkpoint` from one part per node
    /// (the node's id, its state, its [`NodePart`]) and the sources'
    /// positions.
    pub fn assemble(
        graph: &LogicalGraph,
        checkpoint: CheckpointId,
        parts: impl IntoIterator<Item = (usize, S, NodePart<M>)>,
        positions: impl IntoIterator<Item = (usize, P)>,
    ) -> Result<GlobalSnapshot<S, M, P>, AssembleError> {
        let mut states: Vec<Option<S>> = (0..graph.node_count()).map(|_| None).collect();
        let mut channels = Vec::new();
        for (node, state, part) in parts {
            if node >= graph.node_count() {
                return Err(AssembleError::UnknownNode { node });
            }
            let name = graph.name(node).to_owned();
            if part.checkpoint != checkpoint {
                return Err(AssembleError::WrongCheckpoint {
                    node: name,
                    expected: checkpoint,
                    found: part.checkpoint,
                });
            }
            if states[node].replace(state).is_some() {
                return Err(AssembleError::DuplicateNode { node: name });
            }
            for channel_state in part.channel_states {
                let Some(&edge) = graph.inputs(node).get(channel_state.channel) else {
                    return Err(AssembleError::UnknownChannel {
                        node: name,
                        channel: channel_state.channel,
                    });
                };
                channels.push(ChannelEntry {
                    edge,
                    from: graph.name(graph.edges()[edge].from).to_owned(),
                    to: name.clone(),
                    messages: channel_state.messages,
                });
            }
        }
        channels.sort_by_key(|entry| entry.edge);
        let nodes = states
            .into_iter()
            .enumerate()
            .map(|(node, state)| {
                let name = graph.name(node).to_owned();
                match state {
                    Some(state) => Ok(NodeEntry { node: name, state }),
                    None => Err(AssembleError::MissingNode { node: name }),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut source_positions = Vec::new();
        for (node, position) in positions {
            if node >= graph.node_count() {
                return Err(AssembleError::UnknownNode { node });
            }
            source_positions.push(SourceEntry {
                node: graph.name(node).to_owned(),
                position,
            });
        }
        Ok(GlobalSnapshot {
            checkpoint,
            nodes,
            channels,
            source_positions,
        })
    }
}

/// Parts that do not form one global snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssembleError {
    /// A node id is not in the graph.
    #[error("node id {node} is not in the graph")]
    UnknownNode {
        /// The id.
        node: usize,
    },
    /// A node has no part.
    #[error("node `{node}` has no part")]
    MissingNode {
        /// The node.
        node: String,
    },
    /// A node has two parts.
    #[error("node `{node}` has two parts")]
    DuplicateNode {
        /// The node.
        node: String,
    },
    /// A part belongs to another checkpoint.
    #[error("the part of `{node}` belongs to {found}, not {expected}")]
    WrongCheckpoint {
        /// The node.
        node: String,
        /// The checkpoint being assembled.
        expected: CheckpointId,
        /// The part's checkpoint.
        found: CheckpointId,
    },
    /// A channel state names an input the node does not have.
    #[error("node `{node}` has no input channel {channel}")]
    UnknownChannel {
        /// The node.
        node: String,
        /// The channel index.
        channel: usize,
    },
}

impl AssembleError {
    /// Whether trying again could succeed: never, the parts are wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::GraphBuilder;

    /// A two-node ring with no source.
    fn ring() -> LogicalGraph {
        GraphBuilder::new()
            .node("a")
            .node("b")
            .edge("a", "b")
            .edge("b", "a")
            .build()
            .expect("valid")
    }

    #[test]
    fn global_snapshot_round_trips_through_postcard_and_lists_its_parts() {
        let graph = ring();
        let part = |checkpoint, channel_states| NodePart {
            checkpoint,
            channel_states,
        };
        let channel = |channel, messages| crate::protocol::ChannelState { channel, messages };
        let snapshot = GlobalSnapshot::<u64, u32, u64>::assemble(
            &graph,
            CheckpointId(3),
            [
                (0, 10, part(CheckpointId(3), vec![channel(0, vec![7, 8])])),
                (1, 20, part(CheckpointId(3), vec![])),
            ],
            [(0, 99)],
        )
        .expect("assembles");
        assert_eq!(snapshot.parts().count(), 4);
        assert_eq!(snapshot.channel_message_count(), 2);
        assert_eq!(snapshot.channels[0].from, "b");
        let bytes = postcard::to_allocvec(&snapshot).expect("encodes");
        let back: GlobalSnapshot<u64, u32, u64> = postcard::from_bytes(&bytes).expect("decodes");
        assert_eq!(back, snapshot);
    }

    #[test]
    fn assembly_rejects_a_missing_node() {
        let graph = ring();
        let part = NodePart::<u32> {
            checkpoint: CheckpointId(1),
            channel_states: vec![],
        };
        let result =
            GlobalSnapshot::<u8, u32, ()>::assemble(&graph, CheckpointId(1), [(0, 1, part)], []);
        assert_eq!(
            result.unwrap_err(),
            AssembleError::MissingNode { node: "b".into() }
        );
    }
}
