//! Failover regions: the connected components of the graph of subtasks.
//!
//! A region is the set of subtasks that a failure of any one of them must
//! restart together. Restarting fewer would break the consistent cut: a
//! neighbour connected by a channel has moved past the restored snapshot,
//! so records on that channel would be lost or repeated. Every channel
//! connects its two ends, whatever its direction or kind (feedback edges of
//! iterations included), so a keyed shuffle or a rebalance joins every
//! subtask of both operators, and a forward edge joins subtask i to
//! subtask i only. Two regions share no channel, which is why each can
//! restore from the latest completed checkpoint on its own and the union
//! of their parts is still one consistent cut.
//!
//! This module only computes the partition; it never starts, stops or
//! restores anything (the supervisor does).

/// The failover regions of a graph of `node_count` nodes joined by
/// `edges` (pairs of node indexes): each region lists its nodes in
/// ascending order, and regions are ordered by their smallest node.
pub(crate) fn failover_regions(
    node_count: usize,
    edges: impl IntoIterator<Item = (usize, usize)>,
) -> Vec<Vec<usize>> {
    let mut parent: Vec<usize> = (0..node_count).collect();
    for (from, to) in edges {
        let (from, to) = (root(&mut parent, from), root(&mut parent, to));
        // The smaller index becomes the root, so that each region's root is
        // its smallest node and the order below is deterministic.
        let (low, high) = (from.min(to), from.max(to));
        parent[high] = low;
    }
    let mut regions: Vec<Vec<usize>> = Vec::new();
    let mut region_of_root = vec![usize::MAX; node_count];
    for node in 0..node_count {
        let top = root(&mut parent, node);
        if region_of_root[top] == usize::MAX {
            region_of_root[top] = regions.len();
            regions.push(Vec::new());
        }
        regions[region_of_root[top]].push(node);
    }
    regions
}

/// The root of `node`'s set, halving the path on the way (union-find).
fn root(parent: &mut [usize], mut node: usize) -> usize {
    while parent[node] != node {
        parent[node] = parent[parent[node]];
        node = parent[node];
    }
    node
}

#[cfg(test)]
mod tests {
    use super::failover_regions;

    fn check(node_count: usize, edges: &[(usize, usize)], expected: &[&[usize]]) {
        let regions = failover_regions(node_count, edges.iter().copied());
        let expected: Vec<Vec<usize>> = expected.iter().map(|region| region.to_vec()).collect();
        assert_eq!(regions, expected, "edges {edges:?}");
    }

    #[test]
    fn a_single_node_is_its_own_region() {
        check(1, &[], &[&[0]]);
    }

    #[test]
    fn two_independent_pipelines_are_two_regions() {
        check(4, &[(0, 1), (2, 3)], &[&[0, 1], &[2, 3]]);
    }

    #[test]
    fn forward_edges_keep_parallel_lanes_apart() {
        // source[0] → map[0], source[1] → map[1].
        check(4, &[(0, 2), (1, 3)], &[&[0, 2], &[1, 3]]);
    }

    #[test]
    fn a_shuffle_joins_every_subtask_of_both_operators() {
        check(4, &[(0, 2), (0, 3), (1, 2), (1, 3)], &[&[0, 1, 2, 3]]);
    }

    #[test]
    fn a_feedback_edge_joins_like_any_channel() {
        // 0 → 1 forward, 2 → 0 feedback, 3 alone.
        check(4, &[(0, 1), (2, 0)], &[&[0, 1, 2], &[3]]);
    }

    #[test]
    fn the_direction_of_an_edge_does_not_matter() {
        check(5, &[(4, 2), (2, 0), (3, 1)], &[&[0, 2, 4], &[1, 3]]);
    }
}
