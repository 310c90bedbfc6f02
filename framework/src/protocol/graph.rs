//! Graph analysis for the protocol.
//!
//! This module owns the logical graph as the protocol sees it (named nodes,
//! directed edges; parallel edges and self-loops allowed), its validation,
//! the classification of back edges (depth-first search from the sources,
//! then from one node of every strongly connected component no source
//! reaches), the policy of every input channel in each [`SnapshotMode`], the
//! set of initiators. The global snapshot value assembled on this graph is
//! in [`super::global`].
//!
//! It never runs anything and never persists anything: it computes plans
//! and values. Node and channel numbering is by declaration order; channel
//! `i` of a node is its `i`-th incoming edge in edge declaration order.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::node::NodeConfig;
use super::ChannelPolicy;

/// Whether a node is declared as a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeRole {
    /// Reads from outside; must have no inputs.
    Source,
    /// Anything else. An operator without inputs is treated as a source.
    Operator,
}

/// One directed edge (a FIFO channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Edge {
    /// The sending node.
    pub from: usize,
    /// The receiving node.
    pub to: usize,
}

/// Builds a [`LogicalGraph`] by name.
#[derive(Debug, Clone, Default)]
pub struct GraphBuilder {
    nodes: Vec<(String, NodeRole)>,
    edges: Vec<(String, String)>,
}

impl GraphBuilder {
    /// An empty builder.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// Declares a source node.
    pub fn source(mut self, name: &str) -> GraphBuilder {
        self.nodes.push((name.to_owned(), NodeRole::Source));
        self
    }

    /// Declares an operator node.
    pub fn node(mut self, name: &str) -> GraphBuilder {
        self.nodes.push((name.to_owned(), NodeRole::Operator));
        self
    }

    /// Declares an edge from `from` to `to`.
    pub fn edge(mut self, from: &str, to: &str) -> GraphBuilder {
        self.edges.push((from.to_owned(), to.to_owned()));
        self
    }

    /// Validates and builds the graph.
    pub fn build(self) -> Result<LogicalGraph, GraphError> {
        if self.nodes.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut index = HashMap::new();
        for (id, (name, _)) in self.nodes.iter().enumerate() {
            if index.insert(name.clone(), id).is_some() {
                return Err(GraphError::DuplicateName { name: name.clone() });
            }
        }
        let mut edges = Vec::with_capacity(self.edges.len());
        for (from, to) in &self.edges {
            let lookup = |name: &String| {
                index
                    .get(name)
                    .copied()
                    .ok_or_else(|| GraphError::UnknownEndpoint {
                        from: from.clone(),
                        to: to.clone(),
                        missing: name.clone(),
                    })
            };
            edges.push(Edge {
                from: lookup(from)?,
                to: lookup(to)?,
            });
        }
        let graph = LogicalGraph::from_parts(self.nodes, edges);
        if let Some(node) = (0..graph.node_count())
            .find(|&node| graph.roles[node] == NodeRole::Source && !graph.inputs[node].is_empty())
        {
            return Err(GraphError::SourceWithInputs {
                name: graph.names[node].clone(),
            });
        }
        Ok(graph)
    }
}

/// A graph the protocol cannot work with, or a plan it cannot make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// No nodes.
    #[error("the graph has no nodes")]
    Empty,
    /// Two nodes share a name.
    #[error("two nodes are named `{name}`")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// An edge names a node that does not exist.
    #[error("edge `{from}` -> `{to}` names the unknown node `{missing}`")]
    UnknownEndpoint {
        /// The edge's sender as written.
        from: String,
        /// The edge's receiver as written.
        to: String,
        /// The name that does not exist.
        missing: String,
    },
    /// A node declared as a source has an input.
    #[error("source `{name}` has inputs; a source reads only from outside")]
    SourceWithInputs {
        /// The source.
        name: String,
    },
    /// Aligned mode on a graph with a cycle would deadlock or lose messages.
    #[error(
        "the graph has a cycle (back edge `{from}` -> `{to}`); aligned mode works only on DAGs, \
         use the cyclic or unaligned mode"
    )]
    AlignedModeOnCycle {
        /// The back edge's sender.
        from: String,
        /// The back edge's receiver.
        to: String,
    },
    /// A preferred initiator does not exist.
    #[error("preferred initiator `{name}` is not a node")]
    UnknownInitiator {
        /// The name.
        name: String,
    },
    /// A preferred initiator is reachable from a source or from another
    /// component, so barriers reach it anyway.
    #[error("`{name}` cannot be an initiator: it is reachable from a source or another component")]
    InitiatorReachable {
        /// The name.
        name: String,
    },
    /// Back edges given to [`LogicalGraph::plan_with_back_edges`] that do
    /// not make the rest of the graph a DAG reachable from the sources.
    #[error("unusable back edges: {reason}")]
    BadBackEdges {
        /// What is wrong with them.
        reason: String,
    },
    /// Two preferred initiators lie in the same strongly connected component.
    #[error("`{first}` and `{second}` are in the same cycle; choose one initiator per cycle")]
    TwoInitiatorsInComponent {
        /// The first.
        first: String,
        /// The second.
        second: String,
    },
}

impl GraphError {
    /// Whether trying again could succeed: never, the graph is wrong.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

/// Which snapshot algorithm the policies implement (DESIGN §3's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SnapshotMode {
    /// Exactly-once aligned barriers (Flink ABS): every channel ALIGN, no
    /// channel state. DAGs only.
    Aligned,
    /// Chandy-Lamport / unaligned: every channel RECORD.
    Unaligned,
    /// ABS for cycles: forward edges ALIGN, back edges RECORD. On a DAG
    /// this is the same as [`SnapshotMode::Aligned`].
    Cyclic,
    /// At-least-once: forward edges are never held, back edges RECORD so
    /// that no loop message is lost.
    AtLeastOnce,
}

/// A validated logical graph.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogicalGraph {
    names: Vec<String>,
    roles: Vec<NodeRole>,
    edges: Vec<Edge>,
    inputs: Vec<Vec<usize>>,
    outputs: Vec<Vec<usize>>,
}

impl LogicalGraph {
    fn from_parts(nodes: Vec<(String, NodeRole)>, edges: Vec<Edge>) -> LogicalGraph {
        let mut inputs = vec![Vec::new(); nodes.len()];
        let mut outputs = vec![Vec::new(); nodes.len()];
        for (id, edge) in edges.iter().enumerate() {
            outputs[edge.from].push(id);
            inputs[edge.to].push(id);
        }
        let (names, roles) = nodes.into_iter().unzip();
        LogicalGraph {
            names,
            roles,
            edges,
            inputs,
            outputs,
        }
    }

    /// The number of nodes.
    pub fn node_count(&self) -> usize {
        self.names.len()
    }

    /// All edges; an edge's index is its id.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// A node's name.
    pub fn name(&self, node: usize) -> &str {
        &self.names[node]
    }

    /// A node's id by name.
    pub fn find(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|candidate| candidate == name)
    }

    /// The edge ids into `node`; channel `i` of the node is `inputs(node)[i]`.
    pub fn inputs(&self, node: usize) -> &[usize] {
        &self.inputs[node]
    }

    /// The edge ids out of `node`, in declaration order.
    pub fn outputs(&self, node: usize) -> &[usize] {
        &self.outputs[node]
    }

    /// The input channel index of `edge` at its receiving node.
    pub fn channel_of(&self, edge: usize) -> usize {
        let to = self.edges[edge].to;
        self.inputs[to]
            .iter()
            .position(|&candidate| candidate == edge)
            .expect("every edge is an input of its receiver")
    }

    /// The nodes without inputs.
    pub fn sources(&self) -> Vec<usize> {
        (0..self.node_count())
            .filter(|&node| self.inputs[node].is_empty())
            .collect()
    }

    /// Plans a checkpoint protocol for this graph: back edges, initiators
    /// and per-channel policies. `preferred_initiators` names at most one
    /// node per strongly connected component that no source reaches; other
    /// such components get their first node (in declaration order).
    pub fn plan(
        &self,
        mode: SnapshotMode,
        preferred_initiators: &[&str],
    ) -> Result<SnapshotPlan, GraphError> {
        let component = self.strongly_connected_components();
        let roots = self.root_components(&component);
        let chosen = self.choose_initiators(&component, &roots, preferred_initiators)?;
        let mut initiators = self.sources();
        initiators.extend(chosen);
        let back_edges = self.back_edges(&initiators);
        let policies = self.policies(mode, &back_edges)?;
        let feedback = self.feedback_flags(&back_edges);
        Ok(SnapshotPlan {
            mode,
            initiators,
            back_edges,
            policies,
            feedback,
        })
    }

    /// Plans with back edges the caller chose (for example the feedback
    /// edges a job builder declared) instead of the depth-first search of
    /// [`LogicalGraph::plan`]: on a graph of parallel subtasks the search
    /// can pick other edges of the same cycles than the ones that close
    /// the user's loops. Removing `back_edges` must leave a DAG in which
    /// every node with inputs keeps a forward input (so every node is
    /// reachable from a source, and Cyclic mode terminates); the
    /// initiators are the sources.
    pub fn plan_with_back_edges(
        &self,
        mode: SnapshotMode,
        back_edges: &[usize],
    ) -> Result<SnapshotPlan, GraphError> {
        let mut back = back_edges.to_vec();
        back.sort_unstable();
        back.dedup();
        if let Some(&edge) = back.iter().find(|&&edge| edge >= self.edges.len()) {
            return Err(GraphError::BadBackEdges {
                reason: format!("edge {edge} does not exist"),
            });
        }
        let is_back = |edge: &usize| back.binary_search(edge).is_ok();
        let mut forward_inputs: Vec<usize> = self
            .inputs
            .iter()
            .map(|inputs| inputs.iter().filter(|edge| !is_back(edge)).count())
            .collect();
        if let Some(node) = (0..self.node_count())
            .find(|&node| !self.inputs[node].is_empty() && forward_inputs[node] == 0)
        {
            return Err(GraphError::BadBackEdges {
                reason: format!("`{}` has only back edges as inputs", self.names[node]),
            });
        }
        // Kahn's algorithm over the forward edges.
        let mut ready: Vec<usize> = self.sources();
        let mut visited = 0;
        while let Some(node) = ready.pop() {
            visited += 1;
            for edge in self.outputs[node].iter().filter(|edge| !is_back(edge)) {
                let to = self.edges[*edge].to;
                forward_inputs[to] -= 1;
                if forward_inputs[to] == 0 {
                    ready.push(to);
                }
            }
        }
        if visited < self.node_count() {
            return Err(GraphError::BadBackEdges {
                reason: "the other edges still form a cycle".to_owned(),
            });
        }
        let policies = self.policies(mode, &back)?;
        let feedback = self.feedback_flags(&back);
        Ok(SnapshotPlan {
            mode,
            initiators: self.sources(),
            back_edges: back,
            policies,
            feedback,
        })
    }

    /// Per node, per input channel: whether it is one of `back_edges`
    /// (sorted).
    fn feedback_flags(&self, back_edges: &[usize]) -> Vec<Vec<bool>> {
        self.inputs
            .iter()
            .map(|inputs| {
                inputs
                    .iter()
                    .map(|edge| back_edges.binary_search(edge).is_ok())
                    .collect()
            })
            .collect()
    }

    /// Tarjan's algorithm, iterative; returns the component id of each node.
    fn strongly_connected_components(&self) -> Vec<usize> {
        let count = self.node_count();
        let mut index = vec![usize::MAX; count];
        let mut lowlink = vec![0; count];
        let mut on_stack = vec![false; count];
        let mut stack = Vec::new();
        let mut component = vec![usize::MAX; count];
        let mut next_index = 0;
        let mut next_component = 0;
        for start in 0..count {
            if index[start] != usize::MAX {
                continue;
            }
            // Each frame is (node, position in its output list).
            let mut frames = vec![(start, 0)];
            index[start] = next_index;
            lowlink[start] = next_index;
            next_index += 1;
            stack.push(start);
            on_stack[start] = true;
            while let Some(&mut (node, ref mut position)) = frames.last_mut() {
                if let Some(&edge) = self.outputs[node].get(*position) {
                    *position += 1;
                    let next = self.edges[edge].to;
                    if index[next] == usize::MAX {
                        index[next] = next_index;
                        lowlink[next] = next_index;
                        next_index += 1;
                        stack.push(next);
                        on_stack[next] = true;
                        frames.push((next, 0));
                    } else if on_stack[next] {
                        lowlink[node] = lowlink[node].min(index[next]);
                    }
                    continue;
                }
                frames.pop();
                if let Some(&(parent, _)) = frames.last() {
                    lowlink[parent] = lowlink[parent].min(lowlink[node]);
                }
                if lowlink[node] == index[node] {
                    while let Some(member) = stack.pop() {
                        on_stack[member] = false;
                        component[member] = next_component;
                        if member == node {
                            break;
                        }
                    }
                    next_component += 1;
                }
            }
        }
        component
    }

    /// Components with no edge coming in from another component and that
    /// are not a lone source: each needs one initiator.
    fn root_components(&self, component: &[usize]) -> HashSet<usize> {
        let mut roots: HashSet<usize> = component
            .iter()
            .enumerate()
            .filter(|&(node, _)| !self.inputs[node].is_empty())
            .map(|(_, &id)| id)
            .collect();
        for edge in &self.edges {
            if component[edge.from] != component[edge.to] {
                roots.remove(&component[edge.to]);
            }
        }
        roots
    }

    fn choose_initiators(
        &self,
        component: &[usize],
        roots: &HashSet<usize>,
        preferred: &[&str],
    ) -> Result<Vec<usize>, GraphError> {
        let mut chosen: HashMap<usize, usize> = HashMap::new();
        for name in preferred {
            let node = self
                .find(name)
                .ok_or_else(|| GraphError::UnknownInitiator {
                    name: (*name).to_owned(),
                })?;
            if !roots.contains(&component[node]) {
                return Err(GraphError::InitiatorReachable {
                    name: (*name).to_owned(),
                });
            }
            if let Some(first) = chosen.insert(component[node], node) {
                return Err(GraphError::TwoInitiatorsInComponent {
                    first: self.names[first].clone(),
                    second: (*name).to_owned(),
                });
            }
        }
        let mut initiators = Vec::new();
        let mut seen = HashSet::new();
        for (node, &id) in component.iter().enumerate() {
            if roots.contains(&id) && seen.insert(id) {
                initiators.push(chosen.get(&id).copied().unwrap_or(node));
            }
        }
        Ok(initiators)
    }

    /// Depth-first search from the initiators in order; an edge into a node
    /// still on the search stack is a back edge. Removing the back edges
    /// leaves a DAG in which every node is reachable from an initiator.
    fn back_edges(&self, initiators: &[usize]) -> Vec<usize> {
        #[derive(Clone, Copy, PartialEq)]
        enum Color {
            White,
            Gray,
            Black,
        }
        let mut color = vec![Color::White; self.node_count()];
        let mut back = Vec::new();
        for &root in initiators {
            if color[root] != Color::White {
                continue;
            }
            color[root] = Color::Gray;
            let mut frames = vec![(root, 0)];
            while let Some(&mut (node, ref mut position)) = frames.last_mut() {
                let Some(&edge) = self.outputs[node].get(*position) else {
                    color[node] = Color::Black;
                    frames.pop();
                    continue;
                };
                *position += 1;
                let next = self.edges[edge].to;
                match color[next] {
                    Color::White => {
                        color[next] = Color::Gray;
                        frames.push((next, 0));
                    }
                    Color::Gray => back.push(edge),
                    Color::Black => {}
                }
            }
        }
        back.sort_unstable();
        back
    }

    fn policies(
        &self,
        mode: SnapshotMode,
        back_edges: &[usize],
    ) -> Result<Vec<Vec<ChannelPolicy>>, GraphError> {
        if let (SnapshotMode::Aligned, Some(&edge)) = (mode, back_edges.first()) {
            return Err(GraphError::AlignedModeOnCycle {
                from: self.names[self.edges[edge].from].clone(),
                to: self.names[self.edges[edge].to].clone(),
            });
        }
        let policy_of = |edge: usize| {
            let back = back_edges.binary_search(&edge).is_ok();
            match (mode, back) {
                (SnapshotMode::Unaligned, _) | (_, true) => ChannelPolicy::Record,
                (SnapshotMode::AtLeastOnce, false) => ChannelPolicy::AlignNoHold,
                (SnapshotMode::Aligned | SnapshotMode::Cyclic, false) => ChannelPolicy::Align,
            }
        };
        Ok(self
            .inputs
            .iter()
            .map(|inputs| inputs.iter().map(|&edge| policy_of(edge)).collect())
            .collect())
    }
}

/// The result of [`LogicalGraph::plan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPlan {
    /// The mode planned for.
    pub mode: SnapshotMode,
    /// The nodes the coordinator triggers: every source, then one node per
    /// strongly connected component no source reaches.
    pub initiators: Vec<usize>,
    /// Edge ids of the back edges, ascending.
    pub back_edges: Vec<usize>,
    /// Per node, per input channel, the policy.
    pub policies: Vec<Vec<ChannelPolicy>>,
    /// Per node, per input channel, whether it is a back edge.
    pub feedback: Vec<Vec<bool>>,
}

impl SnapshotPlan {
    /// The node machine configuration of `node`.
    pub fn node_config(&self, node: usize, max_concurrent: usize) -> NodeConfig {
        NodeConfig::new(self.policies[node].clone())
            .with_initiator(self.initiators.contains(&node))
            .with_max_concurrent(max_concurrent)
            .with_feedback(self.feedback[node].clone())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chosen_back_edges_must_break_every_cycle() {
        let graph = super::GraphBuilder::new()
            .source("s")
            .node("a")
            .node("b")
            .edge("s", "a")
            .edge("a", "b")
            .edge("b", "a")
            .build()
            .unwrap();
        let plan = graph
            .plan_with_back_edges(super::SnapshotMode::Cyclic, &[2])
            .unwrap();
        assert_eq!(plan.back_edges, [2]);
        assert_eq!(plan.initiators, [0]);
        assert_eq!(
            plan.policies[1],
            [super::ChannelPolicy::Align, super::ChannelPolicy::Record]
        );
        assert!(matches!(
            graph.plan_with_back_edges(super::SnapshotMode::Cyclic, &[]),
            Err(super::GraphError::BadBackEdges { .. })
        ));
        assert!(matches!(
            graph.plan_with_back_edges(super::SnapshotMode::Cyclic, &[1]),
            Err(super::GraphError::BadBackEdges { .. })
        ));
    }

    use super::*;

    fn ring(names: &[&str]) -> GraphBuilder {
        let mut builder = GraphBuilder::new();
        for name in names {
            builder = builder.node(name);
        }
        for (index, name) in names.iter().enumerate() {
            builder = builder.edge(name, names[(index + 1) % names.len()]);
        }
        builder
    }

    fn check_plan(
        builder: GraphBuilder,
        mode: SnapshotMode,
        preferred: &[&str],
        initiators: &[&str],
        back: &[(&str, &str)],
    ) {
        let graph = builder.build().expect("valid graph");
        let plan = graph.plan(mode, preferred).expect("plannable");
        let names: Vec<&str> = plan.initiators.iter().map(|&n| graph.name(n)).collect();
        assert_eq!(names, initiators, "initiators");
        let edges: Vec<(&str, &str)> = plan
            .back_edges
            .iter()
            .map(|&e| {
                let edge = graph.edges()[e];
                (graph.name(edge.from), graph.name(edge.to))
            })
            .collect();
        assert_eq!(edges, back, "back edges");
        for node in 0..graph.node_count() {
            graph
                .plan(mode, preferred)
                .map(|plan| {
                    crate::protocol::NodeMachine::<u8>::new(plan.node_config(node, 1))
                        .expect("every planned node config is valid")
                })
                .expect("plannable");
        }
    }

    fn check_error(
        builder: GraphBuilder,
        mode: SnapshotMode,
        preferred: &[&str],
        want: GraphError,
    ) {
        let result = builder
            .build()
            .and_then(|graph| graph.plan(mode, preferred));
        assert_eq!(result.unwrap_err(), want);
    }

    #[test]
    fn dag_has_sources_as_initiators_and_no_back_edges() {
        let diamond = GraphBuilder::new()
            .source("s")
            .node("a")
            .node("b")
            .node("t")
            .edge("s", "a")
            .edge("s", "b")
            .edge("a", "t")
            .edge("b", "t");
        check_plan(diamond, SnapshotMode::Aligned, &[], &["s"], &[]);
    }

    #[test]
    fn ring_without_source_gets_first_node_as_initiator() {
        check_plan(
            ring(&["a", "b", "c"]),
            SnapshotMode::Cyclic,
            &[],
            &["a"],
            &[("c", "a")],
        );
    }

    #[test]
    fn preferred_initiator_moves_the_back_edge() {
        check_plan(
            ring(&["a", "b", "c"]),
            SnapshotMode::Cyclic,
            &["b"],
            &["b"],
            &[("a", "b")],
        );
    }

    #[test]
    fn feedback_loop_reached_from_source_has_no_extra_initiator() {
        let loop_graph = GraphBuilder::new()
            .source("s")
            .node("a")
            .node("b")
            .edge("s", "a")
            .edge("a", "b")
            .edge("b", "a");
        check_plan(
            loop_graph,
            SnapshotMode::AtLeastOnce,
            &[],
            &["s"],
            &[("b", "a")],
        );
    }

    #[test]
    fn downstream_cycle_of_a_cycle_needs_no_initiator() {
        let two = ring(&["a", "b"])
            .node("c")
            .node("d")
            .edge("c", "d")
            .edge("d", "c")
            .edge("b", "c");
        check_plan(
            two,
            SnapshotMode::Unaligned,
            &[],
            &["a"],
            &[("b", "a"), ("d", "c")],
        );
    }

    #[test]
    fn self_loop_is_its_own_component() {
        let self_loop = GraphBuilder::new().node("a").edge("a", "a");
        check_plan(self_loop, SnapshotMode::Cyclic, &[], &["a"], &[("a", "a")]);
    }

    #[test]
    fn empty_graph_is_rejected() {
        check_error(
            GraphBuilder::new(),
            SnapshotMode::Aligned,
            &[],
            GraphError::Empty,
        );
    }

    #[test]
    fn duplicate_name_is_rejected() {
        let builder = GraphBuilder::new().node("a").node("a");
        check_error(
            builder,
            SnapshotMode::Aligned,
            &[],
            GraphError::DuplicateName { name: "a".into() },
        );
    }

    #[test]
    fn unknown_endpoint_is_rejected() {
        let builder = GraphBuilder::new().node("a").edge("a", "z");
        let want = GraphError::UnknownEndpoint {
            from: "a".into(),
            to: "z".into(),
            missing: "z".into(),
        };
        check_error(builder, SnapshotMode::Aligned, &[], want);
    }

    #[test]
    fn source_with_inputs_is_rejected() {
        let builder = GraphBuilder::new().source("s").node("a").edge("a", "s");
        check_error(
            builder,
            SnapshotMode::Aligned,
            &[],
            GraphError::SourceWithInputs { name: "s".into() },
        );
    }

    #[test]
    fn aligned_mode_on_a_cycle_is_rejected() {
        let want = GraphError::AlignedModeOnCycle {
            from: "b".into(),
            to: "a".into(),
        };
        check_error(ring(&["a", "b"]), SnapshotMode::Aligned, &[], want);
    }

    #[test]
    fn reachable_preferred_initiator_is_rejected() {
        let builder = GraphBuilder::new()
            .source("s")
            .node("a")
            .edge("s", "a")
            .edge("a", "a");
        check_error(
            builder,
            SnapshotMode::Cyclic,
            &["a"],
            GraphError::InitiatorReachable { name: "a".into() },
        );
    }

    #[test]
    fn two_initiators_in_one_cycle_are_rejected() {
        let want = GraphError::TwoInitiatorsInComponent {
            first: "a".into(),
            second: "b".into(),
        };
        check_error(ring(&["a", "b"]), SnapshotMode::Cyclic, &["a", "b"], want);
    }

    #[test]
    fn unknown_initiator_is_rejected() {
        check_error(
            ring(&["a", "b"]),
            SnapshotMode::Cyclic,
            &["q"],
            GraphError::UnknownInitiator { name: "q".into() },
        );
    }
}
