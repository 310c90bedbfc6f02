//! Operator shells: the logic plugged into the runtime's stage and source
//! actors that drives one [`NodeMachine`] per subtask around the user's
//! code.
//!
//! A shell owns the translation between transport and protocol: data
//! batches and time marks go through [`NodeMachine::on_data`] (one batch,
//! watermark or idleness mark is one protocol message, so recorded channel
//! state keeps the marks in order), barriers and end of input are in-band [`Control`] items, held
//! channels are held in the stage (`hold_input`) so their batches keep their
//! credits and the upstream stalls; `TakeSnapshot` takes the operator
//! state on the actor (the synchronous part: bytes, or for keyed state a
//! copy-on-write handoff of its key groups that the writer thread encodes,
//! see `pending`) and the part goes to the supervisor with the node's
//! report. Triggers, completions and aborts come
//! from the supervisor as injected controls.
//!
//! The head of an iteration also ends its loop: once its other inputs
//! ended and its feedback stayed idle long enough, it ends the feedback
//! inputs itself (see `LoopHead`).
//!
//! It never decides a protocol question (the machine does), never does I/O
//! (the supervisor's writer thread does) and never restarts anything.
//!
//! The files: `event` (what travels), `part` (a stored part), `pending`
//! (a state or part still to be encoded), `env` (what a shell is given),
//! `taken` (states awaiting their report), `snapshot` (the
//! concurrent snapshots that are not checkpoints), `stage` and `source`
//! (the two shells).

mod env;
mod event;
mod part;
mod pending;
mod snapshot;
mod source;
mod stage;
mod taken;

pub(crate) use env::{Core, OperatorCounters, ShellEnv};
pub(crate) use event::InputItem;
pub use event::{Control, Data};
pub(crate) use event::{NodeEvent, NodeEventKind};
pub(crate) use part::{decode_channel, is_empty_channel, PartBytes};
/// The inspect tests write recorded channel state as a shell would.
#[cfg(test)]
pub(crate) use part::{encode_batches, encode_channel};
pub(crate) use pending::{DeferredState, PendingPart, TakenState};
pub(crate) use snapshot::PartActivity;
pub(crate) use source::{SourceMaker, SourceShell};
pub(crate) use stage::StageShell;
