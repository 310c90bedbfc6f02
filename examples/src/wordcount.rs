//! wordcount: counts the words of a generated text, or of a file given
//! with `--input PATH`, on the job API, with keyed state per word,
//! checkpoints in a local directory (the file store) and injected crashes,
//! then checks the counts against a direct computation.
//!
//! The graph: `lines` (a paced source of `(record, line)`: generated lines
//! numbered from 0, or a file's lines read by snapflow's file source with
//! the byte offset each line starts at, so a restart resumes at the exact
//! line) → `split` (flat_map into words, each tagged with its record) →
//! key_by word → `count` (keyed state: the word's count; emits
//! `(word, count)` after every occurrence) → `updates` (a collect sink
//! with two-phase commit). The planned crashes panic inside `count`, the
//! stateful operator, at chosen lines (for a file: at those lines' byte
//! offsets).
//!
//! Two checks, both exact: the final per-word state equals a direct count,
//! and the committed updates of each word are exactly `1..=count` (so no
//! update was lost or committed twice across the restarts).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use snapflow::job::{Job, KeyedStateHandle};
use snapflow::sink::{CollectHandle, Sink, SinkFactory};
use snapflow::source::{Source, SourceFactory};
use snapflow::Snapshot;

use crate::common::{
    check_crashes, fresh_store, positive, print_report, CommonArgs, CommonOptions, CrashPlan,
    ExampleError, ExampleOptions, PacedSource, Rng,
};
use crate::lines::FileWithOffsets;

/// The options of the wordcount example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Words of generated text (ignored with `input`).
    pub words: u64,
    /// Count this file's words instead of generated text.
    pub input: Option<PathBuf>,
    /// Parallelism, crashes, checkpoints and pace.
    pub common: CommonOptions,
}

impl ExampleOptions for Options {
    type Args = Args;

    fn full() -> Self {
        Options {
            words: 300_000,
            input: None,
            common: CommonOptions::full(),
        }
    }

    fn smoke() -> Self {
        Options {
            words: 3_000,
            input: None,
            common: CommonOptions::smoke(),
        }
    }

    fn from_args(args: Args) -> Self {
        let defaults = Self::defaults(args.common.smoke);
        Options {
            words: args.words.unwrap_or(defaults.words),
            input: args.input,
            common: args.common.apply(defaults.common),
        }
    }
}

/// wordcount: counts the words of a generated text, or of a file, with
/// keyed state per word, checkpoints and injected crashes, and checks the
/// counts against a direct computation (exit code 1 on a mismatch).
#[derive(Debug, clap::Parser)]
#[command(name = "wordcount", args_override_self = true)]
pub struct Args {
    /// Words of generated text (ignored with --input) [default: 300000,
    /// 3000 with --smoke].
    #[arg(long, value_name = "N", value_parser = positive)]
    words: Option<u64>,
    /// Count this file's words instead of generated text.
    #[arg(long, value_name = "PATH")]
    input: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
}

/// A word's state: how often it was seen.
#[derive(Snapshot, Debug, Clone, Default, PartialEq, Eq)]
pub struct WordCount {
    /// Occurrences so far.
    pub count: u64,
}

/// The text to count: its lines and, for a file, the byte offset where
/// each line starts (the file source's positions).
struct Input {
    lines: Vec<String>,
    /// `Some` for `--input`: `offsets[i]` is where line `i` starts.
    offsets: Option<Vec<u64>>,
}

impl Input {
    fn read(options: &Options) -> Result<Input, ExampleError> {
        let Some(path) = &options.input else {
            return Ok(Input {
                lines: generated_text(options.words),
                offsets: None,
            });
        };
        let text = std::fs::read_to_string(path).map_err(|source| ExampleError::Io {
            path: path.clone(),
            source,
        })?;
        // `str::lines` splits as the file source does: at `\n`, dropping a
        // `\r` before it, with an optional final line ending.
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        Ok(Input {
            offsets: Some(line_offsets(&text, lines.len())),
            lines,
        })
    }

    /// The records a planned crash names: line numbers for generated
    /// text, byte offsets for a file.
    fn crash_records(&self, lines: BTreeSet<u64>) -> BTreeSet<u64> {
        match &self.offsets {
            None => lines,
            Some(offsets) => lines
                .into_iter()
                .filter_map(|line| offsets.get(line as usize).copied())
                .collect(),
        }
    }
}

/// Where each of the first `count` lines of `text` starts.
fn line_offsets(text: &str, count: usize) -> Vec<u64> {
    let after_newlines = text
        .bytes()
        .enumerate()
        .filter(|(_, byte)| *byte == b'\n')
        .map(|(index, _)| index as u64 + 1);
    std::iter::once(0)
        .chain(after_newlines)
        .take(count)
        .collect()
}

/// Runs the example; `Ok` only when the result matches the direct count.
pub fn run(options: &Options) -> Result<(), ExampleError> {
    let input = Input::read(options)?;
    let lines = &input.lines;
    let words: usize = lines
        .iter()
        .map(|line| line.split_whitespace().count())
        .sum();
    let common = &options.common;
    let crash_lines = common.crashes.records(lines.len() as u64);
    let crashes = CrashPlan::new(input.crash_records(crash_lines.clone()));
    let store = fresh_store(&common.checkpoint_root, "wordcount")?;
    let source = match &options.input {
        Some(path) => format!("{} (file source, byte offsets)", path.display()),
        None => "generated text".to_owned(),
    };
    println!(
        "wordcount: {source}: {} lines, {words} words, parallelism {}, checkpoint every {} ms \
         into {}",
        lines.len(),
        common.parallelism,
        common.checkpoint_interval_ms,
        store.job_dir().display()
    );
    match &input.offsets {
        None => println!("  crashes planned in `count` at lines {crash_lines:?}"),
        Some(_) => println!(
            "  crashes planned in `count` at lines {crash_lines:?} (byte offsets {:?})",
            crashes.records()
        ),
    }
    let expected = direct_count(lines);

    let job = Job::new(
        "wordcount",
        common.job_config(Arc::new(store), crashes.planned()),
    );
    let (updates, state) = match &options.input {
        Some(path) => {
            let updates = CollectHandle::new();
            let source = FileWithOffsets::new(path, common.pacing());
            (updates.clone(), declare(&job, source, &crashes, updates))
        }
        None => {
            let updates = CollectHandle::new();
            let source = PacedSource::new(numbered_lines(&input.lines), common.pacing());
            (updates.clone(), declare(&job, source, &crashes, updates))
        }
    };
    let started = Instant::now();
    let report = common.run(job)?;
    let elapsed_ms = started.elapsed().as_millis();
    // A stop with a savepoint (a signal, or the dashboard's "Stop with
    // savepoint") never gets here: `common.run` returns
    // `ExampleError::Stopped`, which exits 0 with no result to check.
    print_report(&report);

    let counts: BTreeMap<String, u64> = state
        .snapshot()
        .into_iter()
        .map(|(word, state)| (word, state.count))
        .collect();
    print_top(&counts);
    println!(
        "done in {elapsed_ms} ms: {} distinct words, {} updates committed",
        counts.len(),
        updates.committed().len()
    );
    check_crashes(&crashes, &report)?;
    check_counts(&counts, &expected)?;
    check_updates(&updates.committed(), &expected)?;
    println!(
        "check: OK, the counts equal a direct computation and every update was committed \
         exactly once despite {} crashes",
        report.restarts.len()
    );
    Ok(())
}

/// Generated lines numbered from 0, as the paced source yields them.
pub(crate) fn numbered_lines(lines: &[String]) -> Vec<(u64, String)> {
    (0_u64..).zip(lines.iter().cloned()).collect()
}

/// lines → split → key_by word → count → `sink` (named `updates`). The
/// source yields `(record number, line)`: the line number of generated
/// text, or the line's byte offset in a file; planned crashes name that
/// number. Returns the handle to the per-word state.
pub(crate) fn declare<F, S>(
    job: &Job,
    source: F,
    crashes: &CrashPlan,
    sink: S,
) -> KeyedStateHandle<String, WordCount>
where
    F: SourceFactory + Send + Sync + 'static,
    F::Source: Source<Item = (u64, String)> + 'static,
    S: SinkFactory + Send + Sync + 'static,
    S::Sink: Sink<Item = (String, u64)> + 'static,
{
    let crashes = crashes.clone();
    let (counted, state) = job
        .source("lines", source)
        .flat_map("split", |(record, line): (u64, String)| {
            words_of(&line)
                .map(|word| (word, record))
                .collect::<Vec<_>>()
        })
        .key_by(|(word, _): &(String, u64)| word.clone())
        .process_with_state(
            "count",
            move |word: &String, state: &mut WordCount, (_, record): (String, u64), out| {
                crashes.check(record);
                state.count += 1;
                out.emit((word.clone(), state.count));
                Ok(())
            },
        );
    counted.sink("updates", sink);
    state
}

/// Words are lowercased and stripped of surrounding punctuation.
pub(crate) fn words_of(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split_whitespace()
        .map(|word| {
            word.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|word| !word.is_empty())
}

/// `words` words of text over a skewed vocabulary, twelve words a line.
pub(crate) fn generated_text(words: u64) -> Vec<String> {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "da", "ve", "zu", "ho", "gi", "be", "fa",
        "yo",
    ];
    let mut rng = Rng::new(2024);
    let mut lines = Vec::new();
    let mut line = Vec::with_capacity(12);
    for _ in 0..words {
        // The square of a uniform number favours small indices: a few
        // words are common and many are rare, as in real text.
        let rank = (rng.unit() * rng.unit() * 600.0) as usize;
        // Base-16 digits as syllables: distinct ranks give distinct words.
        let mut digits = rank;
        let mut word = String::new();
        loop {
            word.push_str(SYLLABLES[digits % 16]);
            digits /= 16;
            if digits == 0 {
                break;
            }
        }
        line.push(word);
        if line.len() == 12 {
            lines.push(line.join(" "));
            line.clear();
        }
    }
    if !line.is_empty() {
        lines.push(line.join(" "));
    }
    lines
}

pub(crate) fn direct_count(lines: &[String]) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in lines {
        for word in words_of(line) {
            *counts.entry(word).or_default() += 1;
        }
    }
    counts
}

/// Prints the five most common words.
pub(crate) fn print_top(counts: &BTreeMap<String, u64>) {
    let mut top: Vec<(&String, &u64)> = counts.iter().collect();
    top.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let shown: Vec<String> = top
        .iter()
        .take(5)
        .map(|(word, count)| format!("{word} {count}"))
        .collect();
    println!("most common: {}", shown.join(", "));
}

pub(crate) fn check_counts(
    counts: &BTreeMap<String, u64>,
    expected: &BTreeMap<String, u64>,
) -> Result<(), ExampleError> {
    if counts == expected {
        return Ok(());
    }
    let differing = expected
        .iter()
        .find(|(word, count)| counts.get(*word) != Some(count))
        .map(|(word, count)| format!("{word}: {:?} instead of {count}", counts.get(word)));
    Err(ExampleError::Mismatch(format!(
        "final counts differ from the direct count ({} words instead of {}; first difference {})",
        counts.len(),
        expected.len(),
        differing.unwrap_or_else(|| "an extra word".to_owned())
    )))
}

/// Every word's committed updates must be exactly `1..=count`.
pub(crate) fn check_updates(
    updates: &[(String, u64)],
    expected: &BTreeMap<String, u64>,
) -> Result<(), ExampleError> {
    let mut seen: HashMap<&str, Vec<u64>> = HashMap::new();
    for (word, count) in updates {
        seen.entry(word).or_default().push(*count);
    }
    for (word, count) in expected {
        let mut committed = seen.remove(word.as_str()).unwrap_or_default();
        committed.sort_unstable();
        if !committed.iter().copied().eq(1..=*count) {
            return Err(ExampleError::Mismatch(format!(
                "the committed updates of {word:?} are not exactly 1..={count} \
                 ({} updates committed)",
                committed.len()
            )));
        }
    }
    if let Some(word) = seen.keys().next() {
        return Err(ExampleError::Mismatch(format!(
            "updates were committed for {word:?}, which is not in the input"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected() -> BTreeMap<String, u64> {
        [("a".to_owned(), 2), ("b".to_owned(), 1)].into()
    }

    fn updates(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter()
            .map(|&(word, count)| (word.to_owned(), count))
            .collect()
    }

    #[test]
    fn exactly_once_updates_pass() {
        assert!(check_updates(&updates(&[("a", 2), ("b", 1), ("a", 1)]), &expected()).is_ok());
    }

    #[test]
    fn a_duplicated_update_is_a_mismatch() {
        let committed = updates(&[("a", 1), ("a", 1), ("a", 2), ("b", 1)]);
        assert!(check_updates(&committed, &expected()).is_err());
    }

    #[test]
    fn a_lost_update_is_a_mismatch() {
        assert!(check_updates(&updates(&[("a", 2), ("b", 1)]), &expected()).is_err());
    }

    #[test]
    fn a_wrong_count_is_a_mismatch() {
        let counts: BTreeMap<String, u64> = [("a".to_owned(), 2), ("b".to_owned(), 2)].into();
        assert!(check_counts(&counts, &expected()).is_err());
    }

    #[test]
    fn words_are_lowercased_without_punctuation() {
        let words: Vec<String> = words_of("The cut, the MARKER! -- ok").collect();
        assert_eq!(words, ["the", "cut", "the", "marker", "ok"]);
    }

    #[test]
    fn line_offsets_follow_newlines() {
        let text = "ab\r\ncd\n\nlast";
        assert_eq!(line_offsets(text, text.lines().count()), [0, 4, 7, 8]);
        assert_eq!(line_offsets("one\n", 1), [0]);
    }

    #[test]
    fn generated_text_has_the_requested_words() {
        let words: usize = generated_text(1_000)
            .iter()
            .map(|line| line.split_whitespace().count())
            .sum();
        assert_eq!(words, 1_000);
    }
}
