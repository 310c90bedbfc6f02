//! Throughput of `FsCheckpointStore` next to the physical bound, measured in
//! the same run: a 256 MB checkpoint of 64 parts written from 2 threads and
//! committed, against one plain sequential write + fsync of the same bytes,
//! and the time to load and verify the checkpoint back.
//!
//! Run: `cargo bench -p snapflow --bench store` (3 runs, medians printed).
//! Smoke: `cargo bench -p snapflow --bench store -- --quick` or
//! `SNAPFLOW_BENCH_QUICK=1` (16 MB, 1 run). This is a benchmark that
//! prints figures, not a test: it asserts only that the data round-trips.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use snapflow::storage::{
    CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore, PartId, StoreOptions,
};

struct Config {
    total_bytes: usize,
    parts: usize,
    threads: usize,
    runs: usize,
}

/// Throughput of `FsCheckpointStore` next to a plain sequential write +
/// fsync of the same bytes, and the time to load and verify it back.
#[derive(Debug, clap::Parser)]
#[command(name = "store")]
struct Arguments {
    /// A smoke run: 16 MB in one run (also `SNAPFLOW_BENCH_QUICK=1`).
    #[arg(long)]
    quick: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn config() -> Config {
    let quick = <Arguments as clap::Parser>::parse().quick
        || std::env::var("SNAPFLOW_BENCH_QUICK").is_ok_and(|value| value != "0");
    Config {
        total_bytes: if quick { 16 << 20 } else { 256 << 20 },
        parts: if quick { 16 } else { 64 },
        threads: 2,
        runs: if quick { 1 } else { 3 },
    }
}

/// Incompressible bytes (xorshift), so no layer can cheat by compressing.
fn payload(len: usize) -> Vec<u8> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// One plain file: write everything, fsync it, fsync the directory.
fn plain_write(dir: &Path, bytes: &[u8]) -> f64 {
    let start = Instant::now();
    let path = dir.join("plain.bin");
    let mut file = File::create(&path).expect("create");
    file.write_all(bytes).expect("write");
    file.sync_all().expect("fsync");
    File::open(dir)
        .expect("open dir")
        .sync_all()
        .expect("fsync dir");
    let seconds = start.elapsed().as_secs_f64();
    std::fs::remove_file(path).expect("remove");
    seconds
}

/// The store: begin, parts from `threads` threads, commit. Returns the
/// write seconds and the load-and-verify seconds.
fn store_write(dir: &Path, bytes: &Arc<Vec<u8>>, config: &Config, checkpoint: u64) -> (f64, f64) {
    let options = StoreOptions {
        retained_checkpoints: 1,
    };
    let store = Arc::new(FsCheckpointStore::open_with(dir, "bench", options).expect("open"));
    let part_len = config.total_bytes / config.parts;
    let start = Instant::now();
    store
        .begin(checkpoint, CheckpointKind::Checkpoint)
        .expect("begin");
    let writers: Vec<_> = (0..config.threads)
        .map(|thread| {
            let (store, bytes) = (Arc::clone(&store), Arc::clone(bytes));
            let parts = config.parts;
            let threads = config.threads;
            std::thread::spawn(move || {
                for index in (thread..parts).step_by(threads) {
                    let part = PartId::new("operator", index as u32);
                    let slice = &bytes[index * part_len..(index + 1) * part_len];
                    store
                        .write_part(checkpoint, &part, slice)
                        .expect("write part");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer thread");
    }
    store
        .commit(checkpoint, CommitRequest::default())
        .expect("commit");
    let write_seconds = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let loaded = store.load(checkpoint).expect("load");
    let load_seconds = start.elapsed().as_secs_f64();
    let loaded_bytes: usize = loaded.parts.values().map(Vec::len).sum();
    assert_eq!(
        loaded_bytes,
        part_len * config.parts,
        "the checkpoint round-trips"
    );
    (write_seconds, load_seconds)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let config = config();
    let bytes = Arc::new(payload(config.total_bytes));
    let megabytes = config.total_bytes as f64 / (1024.0 * 1024.0);
    let dir = tempfile::tempdir().expect("temp dir");
    println!(
        "store bench: {megabytes:.0} MB in {} parts, {} writer threads, {} runs, dir {}",
        config.parts,
        config.threads,
        config.runs,
        dir.path().display()
    );
    let (mut plain, mut store, mut load) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..config.runs {
        // Alternating the two keeps slow phases of the disk from favouring
        // one side.
        let plain_seconds = plain_write(dir.path(), &bytes);
        let (write_seconds, load_seconds) =
            store_write(dir.path(), &bytes, &config, run as u64 + 1);
        println!(
            "  run {run}: plain write+fsync {:.0} MB/s, store write+commit {:.0} MB/s, store load+verify {:.0} MB/s",
            megabytes / plain_seconds,
            megabytes / write_seconds,
            megabytes / load_seconds
        );
        plain.push(plain_seconds);
        store.push(write_seconds);
        load.push(load_seconds);
    }
    let (plain, store, load) = (median(plain), median(store), median(load));
    println!(
        "median plain sequential write + fsync: {:.0} MB/s ({plain:.3} s)",
        megabytes / plain
    );
    println!(
        "median FsCheckpointStore write + commit: {:.0} MB/s ({store:.3} s)",
        megabytes / store
    );
    println!(
        "median FsCheckpointStore load + verify: {:.0} MB/s ({load:.3} s)",
        megabytes / load
    );
    println!("store / plain throughput ratio: {:.2}", plain / store);
}
