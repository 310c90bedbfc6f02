//! The child process of the `store_crash` test: writes checkpoints to a
//! directory in a loop until it is killed, printing `committed <id>` after
//! each commit returns.
//!
//! Usage: `store_writer <root> <seed> [max_checkpoints]`. It resumes after
//! the newest complete checkpoint in `root`, so it can be restarted on the
//! same directory. Part sizes come from `seed`; part bytes follow
//! [`part_bytes`], which the test repeats to check what it reads back. It
//! never reads the parts it writes; checking is the test's job.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use snapflow::storage::{
    CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore, PartId, StoreError,
};

/// The job name the test opens the store with.
const JOB: &str = "store-writer";
/// The default bound on the loop, so a child that is never killed still ends.
const DEFAULT_MAX_CHECKPOINTS: u64 = 100_000;
/// The largest part, in bytes.
const MAX_PART_BYTES: u64 = 256 * 1024;
const OPERATORS: [&str; 4] = ["source", "Parse", "count/by key", "sink"];
const PARALLELISM: u32 = 2;

/// Writes checkpoints to a directory in a loop until it is killed; the
/// child of the `store_crash` test.
#[derive(clap::Parser)]
#[command(name = "store_writer")]
struct Arguments {
    /// The store's root directory.
    root: String,
    /// Chooses the part sizes.
    seed: u64,
    /// The bound on the loop.
    #[arg(default_value_t = DEFAULT_MAX_CHECKPOINTS)]
    max_checkpoints: u64,
}

fn main() -> ExitCode {
    // Clap prints a usage error and exits with code 2.
    let Arguments {
        root,
        seed,
        max_checkpoints,
    } = <Arguments as clap::Parser>::parse();
    let root = root.as_str();
    match run(root, seed, max_checkpoints) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("store_writer: {error}");
            ExitCode::FAILURE
        }
    }
}

fn run(root: &str, seed: u64, max_checkpoints: u64) -> Result<(), StoreError> {
    let store = Arc::new(FsCheckpointStore::open(root, JOB)?);
    let first = store
        .list()?
        .last()
        .map_or(1, |latest| latest.checkpoint + 1);
    let mut stdout = std::io::stdout();
    for checkpoint in first..first.saturating_add(max_checkpoints) {
        write_checkpoint(&store, seed, checkpoint)?;
        // Printed only after commit returned, so every printed id is
        // durable. A failed print means the test went away: stop.
        if writeln!(stdout, "committed {checkpoint}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(());
        }
    }
    Ok(())
}

/// Writes every part of `checkpoint` from two threads, then commits.
fn write_checkpoint(
    store: &Arc<FsCheckpointStore>,
    seed: u64,
    checkpoint: u64,
) -> Result<(), StoreError> {
    store.begin(checkpoint, CheckpointKind::Checkpoint)?;
    let parts: Vec<PartId> = OPERATORS
        .iter()
        .flat_map(|operator| (0..PARALLELISM).map(move |subtask| PartId::new(*operator, subtask)))
        .collect();
    let halves: Vec<Vec<PartId>> = parts.chunks(parts.len() / 2).map(<[_]>::to_vec).collect();
    let writers: Vec<_> = halves
        .into_iter()
        .map(|half| {
            let store = Arc::clone(store);
            std::thread::spawn(move || -> Result<(), StoreError> {
                for part in half {
                    let len = part_len(seed, checkpoint, &part);
                    store.write_part(checkpoint, &part, &part_bytes(checkpoint, &part, len))?;
                }
                Ok(())
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("a part writer panicked")?;
    }
    let mut request = CommitRequest::default();
    request.user.insert("seed".to_string(), seed.to_string());
    store.commit(checkpoint, request)?;
    Ok(())
}

/// A part's length, from the seed (SplitMix64 of seed, id and part).
fn part_len(seed: u64, checkpoint: u64, part: &PartId) -> usize {
    let mut mixed = seed ^ checkpoint.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(part.subtask);
    for byte in part.operator.bytes() {
        mixed = mixed.rotate_left(5) ^ u64::from(byte);
    }
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (mixed ^ (mixed >> 31)) as usize % MAX_PART_BYTES as usize + 1
}

/// A part's bytes: a header line naming checkpoint and part, then a filler
/// that depends on both, cut to `len`. The test repeats this function.
fn part_bytes(checkpoint: u64, part: &PartId, len: usize) -> Vec<u8> {
    let mut bytes = format!("checkpoint {checkpoint} part {part}\n").into_bytes();
    let start = bytes.len();
    bytes.extend((start..len.max(start)).map(|index| (index as u64 ^ checkpoint) as u8));
    bytes.truncate(len);
    bytes
}
