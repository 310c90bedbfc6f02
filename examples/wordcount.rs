//! wordcount: the main example, on the embedded default store (checkpoints in
//! a local directory).
//!
//! Until the actor runtime lands (issue 4), this example drives the
//! foundation by hand: it counts the words of a generated text in chunks,
//! takes a checkpoint of its `#[derive(Snapshot)]` state into an
//! `FsCheckpointStore` after every chunk, and, when asked, "crashes" (drops
//! all in-memory state) and restores from the latest completed checkpoint,
//! rewinding its input to the position stored with it. At the end it checks
//! the counts against a direct computation and says whether they match.
//!
//! ```sh
//! cargo run --release -p snapflow-examples --example wordcount -- --words 200000 --crash-every 7
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use snapflow::state::blob;
use snapflow::storage::{
    CheckpointKind, CheckpointStore, CommitRequest, FsCheckpointStore, LoadedCheckpoint, PartId,
};
use snapflow::Snapshot;

/// The operator's state: a count per word, and how many words it has seen.
#[derive(Snapshot, Debug, Default, PartialEq)]
#[snapshot(version = 1)]
struct WordCounts {
    counts: BTreeMap<String, u64>,
    words_seen: u64,
}

/// Command-line options.
struct Options {
    words: u64,
    chunk_words: u64,
    crash_every_chunks: Option<u64>,
    directory: PathBuf,
}

const OPERATOR: &str = "count";
const SOURCE: &str = "text";

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("wordcount: {message}");
            eprintln!(
                "usage: wordcount [--words N] [--chunk-words N] [--crash-every CHUNKS] [--dir PATH]"
            );
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("wordcount: {error}");
            ExitCode::FAILURE
        }
    }
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        words: 100_000,
        chunk_words: 10_000,
        crash_every_chunks: Some(4),
        directory: PathBuf::from("target/snapflow-checkpoints"),
    };
    let mut arguments = std::env::args().skip(1);
    while let Some(flag) = arguments.next() {
        let mut value = || arguments.next().ok_or(format!("{flag} needs a value"));
        let number = |text: String| {
            text.parse::<u64>()
                .map_err(|_| format!("{flag} takes a whole number, not {text:?}"))
        };
        match flag.as_str() {
            "--words" => options.words = number(value()?)?,
            "--chunk-words" => options.chunk_words = number(value()?)?.max(1),
            "--crash-every" => {
                options.crash_every_chunks = Some(number(value()?)?).filter(|every| *every > 0)
            }
            "--no-crash" => options.crash_every_chunks = None,
            "--dir" => options.directory = PathBuf::from(value()?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(options)
}

/// The i-th word of the generated text. Deterministic, so a rewound input
/// yields exactly the same words again.
fn word_at(index: u64) -> String {
    const WORDS: [&str; 12] = [
        "stream",
        "state",
        "barrier",
        "snapshot",
        "actor",
        "channel",
        "marker",
        "cut",
        "source",
        "sink",
        "operator",
        "checkpoint",
    ];
    let mixed = index.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    WORDS[(mixed % WORDS.len() as u64) as usize].to_string()
}

fn run(options: &Options) -> Result<bool, Box<dyn std::error::Error>> {
    // A fresh job directory per run keeps the example repeatable.
    let job = "wordcount";
    let root = options.directory.clone();
    let _ = std::fs::remove_dir_all(root.join(format!("job-{job}")));
    let store = FsCheckpointStore::open(&root, job)?;
    println!(
        "wordcount: {} words in chunks of {}, checkpoints in {}",
        options.words,
        options.chunk_words,
        store.job_dir().display()
    );

    let mut state = WordCounts::default();
    let mut position: u64 = 0;
    let mut checkpoint: u64 = 0;
    let mut chunks_since_crash: u64 = 0;
    let mut crashes: u64 = 0;
    while position < options.words {
        let end = (position + options.chunk_words).min(options.words);
        for index in position..end {
            *state.counts.entry(word_at(index)).or_default() += 1;
            state.words_seen += 1;
        }
        position = end;
        chunks_since_crash += 1;

        // Crash before the checkpoint of this chunk, so the restore really
        // has to rewind the input and count the chunk again.
        if options
            .crash_every_chunks
            .is_some_and(|every| chunks_since_crash % every == 0)
            && position < options.words
        {
            crashes += 1;
            let (restored_state, restored_position) = restore(&store)?;
            println!(
                "  crash #{crashes} at word {position}: restored checkpoint with {} words seen, \
                 rewinding input to word {restored_position}",
                restored_state.words_seen
            );
            state = restored_state;
            position = restored_position;
            chunks_since_crash = 0;
            continue;
        }

        checkpoint += 1;
        let bytes = take_checkpoint(&store, checkpoint, &state, position)?;
        println!("  checkpoint {checkpoint} complete: input position {position}, {bytes} bytes");
    }

    let expected = direct_count(options.words);
    let matches = expected == state.counts && state.words_seen == options.words;
    println!(
        "done: {} words, {} distinct, {checkpoint} checkpoints, {crashes} crashes",
        state.words_seen,
        state.counts.len()
    );
    if matches {
        println!("check: counts equal a direct computation (exactly once)");
    } else {
        println!("check: MISMATCH against a direct computation");
    }
    Ok(matches)
}

fn take_checkpoint(
    store: &FsCheckpointStore,
    checkpoint: u64,
    state: &WordCounts,
    position: u64,
) -> Result<u64, Box<dyn std::error::Error>> {
    let bytes = blob::encode(state)?;
    store.begin(checkpoint, CheckpointKind::Checkpoint)?;
    store.write_part(checkpoint, &PartId::new(OPERATOR, 0), &bytes)?;
    let mut request = CommitRequest::default();
    request
        .source_positions
        .insert(PartId::new(SOURCE, 0), position.to_le_bytes().to_vec());
    let metadata = store.commit(checkpoint, request)?;
    Ok(metadata.total_bytes())
}

fn restore(store: &FsCheckpointStore) -> Result<(WordCounts, u64), Box<dyn std::error::Error>> {
    let report = store.load_latest()?;
    for skipped in &report.skipped {
        println!(
            "  skipped checkpoint {}: {}",
            skipped.checkpoint, skipped.reason
        );
    }
    let Some(loaded) = report.checkpoint else {
        // No checkpoint yet: start from the beginning, as Flink does.
        return Ok((WordCounts::default(), 0));
    };
    Ok((decode_state(&loaded)?, decode_position(&loaded)?))
}

fn decode_state(loaded: &LoadedCheckpoint) -> Result<WordCounts, Box<dyn std::error::Error>> {
    let part = loaded
        .parts
        .get(&PartId::new(OPERATOR, 0))
        .ok_or("checkpoint has no part for the count operator")?;
    Ok(blob::decode(part)?)
}

fn decode_position(loaded: &LoadedCheckpoint) -> Result<u64, Box<dyn std::error::Error>> {
    let bytes = loaded
        .metadata
        .source_positions
        .get(&PartId::new(SOURCE, 0))
        .ok_or("checkpoint has no source position")?;
    let bytes: [u8; 8] = bytes
        .as_slice()
        .try_into()
        .map_err(|_| "source position is not 8 bytes")?;
    Ok(u64::from_le_bytes(bytes))
}

fn direct_count(words: u64) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for index in 0..words {
        *counts.entry(word_at(index)).or_default() += 1;
    }
    counts
}
