//! A sound partial-order reduction for the exhaustive explorer: in every
//! state it picks, when it can, a small set of enabled steps such that
//! every step that could run before one of them commutes with all of them
//! (a persistent set), and explores only those. It owns the choice of that
//! set and the argument why the choice loses nothing; it never changes how
//! a step is carried out (that is `sim.rs`) and never checks anything
//! itself.
//!
//! # The safe steps
//!
//! A step is *safe* here when it is the delivery of the head of a channel
//! `e` into its receiver `r` and
//!
//! 1. the head is a marker of a snapshot that `r` already knows (it tracks
//!    it or has answered its collector), so the delivery only ends the
//!    recording of `e` for that snapshot and perhaps reports `r`'s part; or
//! 2. the head is a data message, `r` may start no snapshot any more, and
//!    no first marker of a snapshot can reach `r` on another input: every
//!    other input of `r` has ended, or no node may start a snapshot any more
//!    and `r` knows every snapshot that was started; or
//! 3. the head is the first marker of a snapshot at `r`, and nothing else
//!    can ever happen at `r` before it: `r` may start no snapshot, end no
//!    output and send nothing (no send is left, or its outputs ended), and
//!    every other input of `r` has ended.
//!
//! Where no step is safe, the second kind of set is every enabled delivery
//! into one node `r` whose inputs are *closed off*: `r` may start no
//! snapshot, every input of `r` is non-empty or has ended (so every
//! delivery into `r` that can ever happen before one of these is one of
//! these), and, if one of the heads is the first marker of a snapshot at
//! `r`, `r` may neither send nor end its outputs. Of all such nodes the one
//! with the fewest deliveries is taken; where there is none, every enabled
//! step is explored.
//!
//! The reduction is off (every enabled step is explored) when the bound on
//! concurrent snapshots is below the number of snapshots, because then a
//! part finishing (case 1) frees a place and changes whether a later first
//! marker is declined. Deliveries of end-of-input are never safe.
//!
//! # Why a safe step is independent of every other step
//!
//! Independence is meant as: in any state where both steps are enabled,
//! neither disables the other and both orders reach the same world and
//! make the same reports to the same collectors. Only `Deliver(e)` pops `e`,
//! so a safe step stays enabled whatever else runs, and the next item of
//! `e` is delivered by the same step later, never by another one. Steps at
//! other nodes push onto the tail of `e` (which is not empty, so head and
//! tail commute), or pop channels this step only pushes onto (a push on the
//! tail enables at most, and commutes with a pop of a non-empty head), or
//! touch only their own node. At `r` itself:
//!
//! - Case 1 sets "marker arrived on `e`" for one snapshot `S` and may finish
//!   `S`'s part; it sends nothing. A data message on another input `e'` is
//!   recorded only for snapshots whose marker has not come on `e'`, and `S`
//!   can only finish once it has, so the data lands in the same records in
//!   either order. A first marker (or a start) of another snapshot adds an
//!   entry that starts from the ended inputs, never from `S`'s flags; with
//!   no decline possible (above) the count of snapshots in flight changes
//!   nothing. Sends and end of outputs at `r` do not touch the machine.
//! - Case 2 records the message for the snapshots whose marker has not come
//!   on `e`, adds it to `r`'s balance and received set, and sends nothing.
//!   The only steps at `r` it does not commute with are those that create a
//!   snapshot entry at `r` (a start, a first marker on another input), and
//!   the conditions rule both out for ever. Markers of known snapshots on
//!   other inputs change flags of other channels; a send at `r` leaves the
//!   machine alone and only needs a positive balance, which the delivery
//!   raises. Freeing a place in the bound of data in flight can only enable
//!   sends, never disable one.
//! - Case 3 takes `r`'s snapshot point and sends the snapshot's markers;
//!   by its conditions no other step at `r` can run before it, so only
//!   steps at other nodes remain, which commute as above.
//!
//! For a set of deliveries into a closed-off `r`, every step outside the
//! set that can run before them is a step at another node (which commutes
//! as above) or a send or end of outputs at `r`; those touch no machine and
//! commute with the delivery of data, of a known marker or of an end of
//! input, and the conditions rule them out when a first marker is among
//! the heads. No start at `r` can run, and no other delivery into `r`.
//!
//! For the world to be equal in both orders, the simulator names each
//! message by its sender and the sender's count of sends, and keeps the
//! completed and declined snapshots and each node's received message ids
//! as sorted lists (their order carries no information any check uses).
//!
//! # Why every checked property is kept
//!
//! The state graph is finite and acyclic (every step consumes a budget or
//! delivers an item, and items are created only by budgeted steps or by a
//! node's first hearing of a snapshot, once per snapshot and node). For a
//! persistent set `T` in state `s` (Godefroid, *Partial-Order Methods for
//! the Verification of Concurrent Systems*, 1996, chapter 4), every path
//! `w` from `s` to a terminal state contains a step of `T` (a step of `T`
//! is enabled at `s` and nothing outside `T` disables it, so no state
//! without it is terminal), and moving the first such step to the front
//! across the steps before it, each independent of it, gives a path with
//! the same end state. By
//! induction on the length of `w`, the reduced graph holds, for every full
//! path to a terminal state, a path that differs from it only by swaps of
//! adjacent independent steps. Such swaps keep
//!
//! - the terminal state, so "every snapshot completed everywhere" is
//!   checked on exactly the same terminal states;
//! - every snapshot's outcome (balances at the snapshot points, recorded
//!   channel states), because a swap changes neither step's effect;
//! - every oracle verdict (the swaps below are those of the safe steps; for
//!   the second kind, the swaps at `r` are of a send, an end of outputs or
//!   another node's step with a delivery into `r` that takes no snapshot
//!   point): a snapshot's cut is consistent, and its channel
//!   states exact, depending only on which side of each process's snapshot
//!   point each send and receive falls. A swap of two steps of different
//!   processes keeps each process's own order of events. The only swaps at
//!   one process involve a case 1 step, which puts no event in the trace,
//!   or a case 2 step (a receive) with a step that takes no snapshot point
//!   either (a receive, a send, a known marker, an end of outputs), so
//!   every event stays on its side of every cut (the oracle's vector
//!   clocks agree with this prefix-cut criterion).
//!
//! Every path of the full graph is the prefix of one to a terminal state,
//! so every completion the full exploration checks is checked (same
//! outcome, same verdict) by the reduced one. The tests also check this
//! directly: for the small cases they run both explorations and compare the
//! sets of snapshot outcomes and of terminal states.

use snapflow::protocol::SnapshotId;

use crate::exhaustive::Step;
use crate::sim::{Ctx, Item, World};

/// Whether the reduction may be used for a case with `snapshots` snapshots
/// under a per-node bound of `max_concurrent`: only when nothing can be
/// declined (see the module documentation).
pub fn applies(max_concurrent: usize, snapshots: u32) -> bool {
    max_concurrent >= snapshots as usize
}

/// A persistent set of `world`'s enabled steps, if one of the two kinds in
/// the module documentation applies: a safe
/// step alone (the delivery on the lowest numbered channel whose head is
/// safe), or else the deliveries into the node with the fewest enabled
/// deliveries whose inputs are all closed off. A function of the world
/// alone, so the reduced graph does not depend on the search order.
pub fn persistent_steps(world: &World, ctx: &Ctx<'_>) -> Option<Vec<Step>> {
    if let Some(edge) = (0..world.channels.len()).find(|&edge| is_safe(world, ctx, edge)) {
        return Some(vec![Step::Deliver(edge)]);
    }
    let graph = &ctx.setup.graph;
    (0..graph.node_count())
        .filter(|&node| inputs_closed_off(world, ctx, node))
        .map(|node| {
            graph
                .inputs(node)
                .iter()
                .filter(|&&edge| !world.channels[edge].is_empty())
                .map(|&edge| Step::Deliver(edge))
                .collect::<Vec<_>>()
        })
        .filter(|steps| !steps.is_empty())
        .min_by_key(Vec::len)
}

/// The second kind of persistent set: every delivery into `node` that can
/// ever happen before one of them is enabled now, and nothing outside them
/// fails to commute with them. So `node` may start no snapshot, each of its
/// inputs is non-empty or has ended, and, if a head is the first marker of
/// a snapshot at `node`, `node` may neither send nor end its outputs.
fn inputs_closed_off(world: &World, ctx: &Ctx<'_>, node: usize) -> bool {
    let graph = &ctx.setup.graph;
    let machine = &world.machines[node];
    if world.starts_left[node] > 0 {
        return false;
    }
    let mut first_marker = false;
    for (channel, &edge) in graph.inputs(node).iter().enumerate() {
        match world.channels[edge].front() {
            None if machine.input_ended(channel) => {}
            None => return false,
            Some(Item::Marker(id)) if !knows(world, node, *id) => first_marker = true,
            Some(_) => {}
        }
    }
    !first_marker || (!world.may_end[node] && cannot_send(world, ctx, node))
}

fn cannot_send(world: &World, ctx: &Ctx<'_>, node: usize) -> bool {
    world.sends_left == 0
        || ctx
            .setup
            .graph
            .outputs(node)
            .iter()
            .all(|&output| world.output_ended[output])
}

/// Whether delivering the head of `edge` is safe (the module
/// documentation's three cases).
fn is_safe(world: &World, ctx: &Ctx<'_>, edge: usize) -> bool {
    let node = ctx.setup.graph.edges()[edge].to;
    match world.channels[edge].front() {
        Some(Item::Marker(id)) if knows(world, node, *id) => true,
        Some(Item::Marker(_)) => first_marker_is_safe(world, ctx, edge, node),
        Some(Item::Data(_)) => {
            world.starts_left[node] == 0
                && (others_ended(world, ctx, edge, node) || !may_hear_of_more(world, node))
        }
        Some(Item::End) | None => false,
    }
}

/// Case 3: the first marker of a snapshot at `node` commutes with nothing
/// else at `node`, so it is safe only when nothing else can happen there:
/// no start, no send, no end of outputs, and no other open input.
fn first_marker_is_safe(world: &World, ctx: &Ctx<'_>, edge: usize, node: usize) -> bool {
    world.starts_left[node] == 0
        && !world.may_end[node]
        && cannot_send(world, ctx, node)
        && others_ended(world, ctx, edge, node)
}

/// Whether every input of `node` other than `edge` has ended (its end of
/// input was delivered), so nothing more arrives on it.
fn others_ended(world: &World, ctx: &Ctx<'_>, edge: usize, node: usize) -> bool {
    let graph = &ctx.setup.graph;
    let machine = &world.machines[node];
    graph
        .inputs(node)
        .iter()
        .enumerate()
        .all(|(channel, &input)| input == edge || machine.input_ended(channel))
}

/// Whether `node` may still hear of a snapshot it does not know: some node
/// may still start one, or one was started that `node` does not know.
fn may_hear_of_more(world: &World, node: usize) -> bool {
    world.starts_left.iter().any(|&left| left > 0)
        || world.collecting.keys().any(|&id| !knows(world, node, id))
}

/// Whether `node` knows snapshot `id`: it tracks it (taking part or
/// declined) or has answered its collector, or the snapshot is finished
/// (then every node answered, or only its initiator heard of it).
fn knows(world: &World, node: usize, id: SnapshotId) -> bool {
    let Some(collected) = world.collecting.get(&id) else {
        return true;
    };
    let machine = &world.machines[node];
    collected.answers[node].is_some()
        || machine.snapshots_in_flight().any(|known| known == id)
        || machine.declined_in_flight().any(|known| known == id)
}
