//! Tests of the built-in sources through the public `Source` and
//! `SourceFactory` traits: seek/resume exactness, splits that partition the
//! input, and the file source's line rules and typed errors.

use std::fmt::Debug;
use std::io::Write;

use proptest::prelude::*;
use snapflow::source::{
    FileLinesSourceFactory, GeneratorSourceFactory, IterSourceFactory, Source, SourceError,
    SourceFactory, SourcePoll, SourcePosition, VecSourceFactory,
};

/// Polls until the source ends, in batches of `batch_records`.
fn drain<S: Source>(source: &mut S, batch_records: usize) -> Vec<S::Item> {
    let mut out = Vec::new();
    loop {
        match source.poll_batch(&mut out, batch_records).expect("poll") {
            SourcePoll::Produced(count) => assert!(count >= 1 && count <= batch_records),
            SourcePoll::Idle => panic!("a bounded built-in source is never idle"),
            SourcePoll::Ended => return out,
        }
    }
}

/// Polls until `count` records are read (or the source ends).
fn take<S: Source>(source: &mut S, count: usize, batch_records: usize) -> Vec<S::Item> {
    let mut out = Vec::new();
    while out.len() < count {
        let wanted = batch_records.min(count - out.len());
        if source.poll_batch(&mut out, wanted).expect("poll") == SourcePoll::Ended {
            break;
        }
    }
    out
}

/// Reads `cut` records, takes the position, reads the rest; then seeks the
/// same source back and a fresh one (a restore) to that position, and both
/// must read the same rest. Returns everything the split produced.
fn check_resume<F>(
    factory: &F,
    subtask: usize,
    parallelism: usize,
    cut: usize,
) -> Vec<<F::Source as Source>::Item>
where
    F: SourceFactory,
    <F::Source as Source>::Item: PartialEq + Debug,
{
    let mut source = factory.split(subtask, parallelism).expect("split");
    let mut head = take(&mut source, cut, 3);
    let position = source.position();
    let rest = drain(&mut source, 4);
    assert_eq!(
        source.poll_batch(&mut Vec::new(), 4).expect("poll"),
        SourcePoll::Ended
    );
    source.seek(&position).expect("seek back");
    assert_eq!(drain(&mut source, 7), rest, "same source after seek back");
    let mut restored = factory.split(subtask, parallelism).expect("split");
    restored.seek(&position).expect("seek in a new source");
    assert_eq!(drain(&mut restored, 2), rest, "new source after seek");
    head.extend(rest);
    head
}

/// Every subtask resumes exactly at several cuts, and the splits in subtask
/// order concatenate to `expected`.
fn check_contiguous<F>(factory: &F, expected: &[<F::Source as Source>::Item])
where
    F: SourceFactory,
    <F::Source as Source>::Item: PartialEq + Debug + Clone,
{
    for parallelism in 1..=3 {
        let mut all = Vec::new();
        for subtask in 0..parallelism {
            let whole = check_resume(factory, subtask, parallelism, 0);
            for cut in [1, 2, whole.len() / 2, whole.len()] {
                assert_eq!(check_resume(factory, subtask, parallelism, cut), whole);
            }
            all.extend(whole);
        }
        assert_eq!(all, expected, "parallelism {parallelism}");
    }
}

#[test]
fn vec_source_resumes_and_partitions() {
    for length in [0, 1, 2, 10, 11] {
        let records: Vec<u32> = (0..length).collect();
        check_contiguous(&VecSourceFactory::new(records.clone()), &records);
    }
}

#[test]
fn generator_source_resumes_and_partitions() {
    for range in [0..0, 5..6, 100..137] {
        let expected: Vec<u64> = range.clone().map(|index| index * 3).collect();
        check_contiguous(
            &GeneratorSourceFactory::new(range, |index| index * 3),
            &expected,
        );
    }
}

#[test]
fn generator_source_fills_one_batch_in_one_call() {
    let factory = GeneratorSourceFactory::new(0..10_000, |index| index as u32);
    let mut source = factory.split(0, 1).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        source.poll_batch(&mut out, 4096).unwrap(),
        SourcePoll::Produced(4096)
    );
    assert_eq!(source.position(), SourcePosition::from_index(4096));
}

#[test]
fn iter_source_resumes_and_strides() {
    for length in [0_u32, 1, 2, 10, 11] {
        let factory = IterSourceFactory::new(move || (0..length).map(|value| value * 2));
        for parallelism in 1..=3_usize {
            let mut seen = Vec::new();
            for subtask in 0..parallelism {
                let whole = check_resume(&factory, subtask, parallelism, 0);
                for cut in [1, 2, whole.len() / 2, whole.len()] {
                    assert_eq!(check_resume(&factory, subtask, parallelism, cut), whole);
                }
                let stride: Vec<u32> = (0..length)
                    .skip(subtask)
                    .step_by(parallelism)
                    .map(|value| value * 2)
                    .collect();
                assert_eq!(whole, stride);
                seen.extend(whole);
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..length).map(|value| value * 2).collect::<Vec<_>>());
        }
    }
}

#[test]
fn iter_source_rejects_another_subtasks_position() {
    let factory = IterSourceFactory::new(|| 0..10);
    let mut source = factory.split(1, 2).unwrap();
    let error = source.seek(&SourcePosition::from_index(4)).unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::ForeignPosition {
                position: 4,
                subtask: 1,
                parallelism: 2
            }
        ),
        "{error}"
    );
}

#[test]
fn splits_reject_bad_subtasks() {
    let factory = VecSourceFactory::new(vec![1, 2, 3]);
    for (subtask, parallelism) in [(0, 0), (2, 2), (5, 3)] {
        let error = factory.split(subtask, parallelism).unwrap_err();
        assert!(matches!(error, SourceError::InvalidSplit { .. }), "{error}");
        assert!(!error.is_retryable());
    }
}

#[test]
fn positions_outside_the_split_or_malformed_are_rejected() {
    let factory = VecSourceFactory::new((0..10).collect::<Vec<u8>>());
    let mut source = factory.split(1, 2).unwrap();
    let error = source.seek(&SourcePosition::from_index(2)).unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::PositionOutOfSplit {
                position: 2,
                start: 5,
                end: 10
            }
        ),
        "{error}"
    );
    let error = source
        .seek(&SourcePosition::from_bytes(vec![1, 2, 3]))
        .unwrap_err();
    assert!(
        matches!(error, SourceError::MalformedPosition { length_bytes: 3 }),
        "{error}"
    );
    assert!(!error.is_retryable());
}

// ---- file source ----

fn write_file(contents: &[u8]) -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(contents).expect("write");
    file.flush().expect("flush");
    file
}

/// The lines a reader of `contents` must see: split at `\n`, a `\r` before
/// `\n` dropped, no empty line after a final `\n`.
fn expected_lines(contents: &str) -> Vec<String> {
    let mut lines: Vec<String> = contents.split('\n').map(str::to_owned).collect();
    if lines.last().is_some_and(String::is_empty) {
        lines.pop();
    }
    let count = lines.len();
    for (index, line) in lines.iter_mut().enumerate() {
        let ended_by_newline = index + 1 < count || contents.ends_with('\n');
        if ended_by_newline && line.ends_with('\r') {
            line.pop();
        }
    }
    lines
}

fn read_lines(contents: &[u8], max_line_bytes: usize) -> Result<Vec<String>, SourceError> {
    let file = write_file(contents);
    let factory = FileLinesSourceFactory::new(file.path()).max_line_bytes(max_line_bytes);
    let mut source = factory.split(0, 1)?;
    let mut out = Vec::new();
    while source.poll_batch(&mut out, 2)? != SourcePoll::Ended {}
    Ok(out)
}

fn check_lines(contents: &str, expected: &[&str]) {
    assert_eq!(
        read_lines(contents.as_bytes(), 64).expect("read"),
        expected,
        "{contents:?}"
    );
    assert_eq!(
        expected_lines(contents),
        expected,
        "the test oracle disagrees on {contents:?}"
    );
    let file = write_file(contents.as_bytes());
    let expected: Vec<String> = expected.iter().map(|line| line.to_string()).collect();
    check_contiguous(&FileLinesSourceFactory::new(file.path()), &expected);
}

#[test]
fn file_lines_plain() {
    check_lines("a\nbb\nccc\n", &["a", "bb", "ccc"]);
}

#[test]
fn file_lines_final_line_without_newline() {
    check_lines("a\nbb", &["a", "bb"]);
}

#[test]
fn file_lines_crlf() {
    check_lines("a\r\nb\r\n\r\nc", &["a", "b", "", "c"]);
}

#[test]
fn file_lines_empty_lines_and_file() {
    check_lines("\n\nx\n\n", &["", "", "x", ""]);
    check_lines("", &[]);
}

#[test]
fn file_lines_lone_carriage_return_at_end_stays() {
    check_lines("a\nb\r", &["a", "b\r"]);
}

#[test]
fn file_seek_to_a_line_start_resumes() {
    let file = write_file(b"abc\ndef\nghi\n");
    let mut source = FileLinesSourceFactory::new(file.path())
        .split(0, 1)
        .unwrap();
    source.seek(&SourcePosition::from_index(4)).unwrap();
    assert_eq!(drain(&mut source, 10), ["def", "ghi"]);
    source.seek(&SourcePosition::from_index(12)).unwrap();
    assert_eq!(drain(&mut source, 10), Vec::<String>::new());
}

#[test]
fn file_seek_into_the_middle_of_a_line_is_a_typed_error() {
    let file = write_file(b"abc\ndef\n");
    let mut source = FileLinesSourceFactory::new(file.path())
        .split(0, 1)
        .unwrap();
    take(&mut source, 1, 1);
    for offset in [1, 3, 5] {
        let error = source
            .seek(&SourcePosition::from_index(offset))
            .unwrap_err();
        assert!(
            matches!(error, SourceError::NotLineStart { offset_bytes } if offset_bytes == offset),
            "{error}"
        );
        assert!(!error.is_retryable());
    }
    // A failed seek leaves the source where it was.
    assert_eq!(drain(&mut source, 10), ["def"]);
    let error = source.seek(&SourcePosition::from_index(9)).unwrap_err();
    assert!(
        matches!(error, SourceError::PositionOutOfSplit { position: 9, .. }),
        "{error}"
    );
}

#[test]
fn file_line_longer_than_the_bound_is_a_typed_error() {
    let file = write_file(b"abc\nabcd\nx\n");
    let factory = FileLinesSourceFactory::new(file.path()).max_line_bytes(3);
    let mut source = factory.split(0, 1).unwrap();
    let mut out = Vec::new();
    assert_eq!(
        source.poll_batch(&mut out, 10).unwrap(),
        SourcePoll::Produced(1)
    );
    assert_eq!(out, ["abc"]);
    for _ in 0..2 {
        let error = source.poll_batch(&mut out, 10).unwrap_err();
        assert!(
            matches!(
                error,
                SourceError::LineTooLong {
                    offset_bytes: 4,
                    max_line_bytes: 3
                }
            ),
            "{error}"
        );
        assert!(!error.is_retryable());
    }
    assert_eq!(source.position(), SourcePosition::from_index(4));
    source.seek(&SourcePosition::from_index(9)).unwrap();
    assert_eq!(drain(&mut source, 10), ["x"]);
}

#[test]
fn file_line_bound_excludes_the_line_ending() {
    assert_eq!(
        read_lines(b"abc\r\nabc\nabc", 3).unwrap(),
        ["abc", "abc", "abc"]
    );
    assert!(matches!(
        read_lines(b"abcd", 3),
        Err(SourceError::LineTooLong { .. })
    ));
    assert!(matches!(
        read_lines(b"abc\rd\n", 3),
        Err(SourceError::LineTooLong { .. })
    ));
}

#[test]
fn file_line_that_is_not_utf8_is_a_typed_error() {
    let error = read_lines(b"ok\n\xff\xfe\n", 64).unwrap_err();
    assert!(
        matches!(error, SourceError::InvalidUtf8 { offset_bytes: 3 }),
        "{error}"
    );
}

#[test]
fn missing_file_is_an_io_error() {
    let error = FileLinesSourceFactory::new("/nonexistent/snapflow/input")
        .split(0, 1)
        .unwrap_err();
    assert!(matches!(error, SourceError::Io { .. }), "{error}");
    assert!(!error.is_retryable());
}

/// Lines of random printable text, with random endings (LF or CRLF) and
/// sometimes no final newline.
fn file_contents() -> impl Strategy<Value = String> {
    let line = ("[a-z ]{0,12}", any::<bool>());
    (proptest::collection::vec(line, 0..40), any::<bool>()).prop_map(|(lines, final_newline)| {
        let mut text = String::new();
        for (index, (line, crlf)) in lines.iter().enumerate() {
            text.push_str(line);
            if index + 1 < lines.len() || final_newline {
                text.push_str(if *crlf { "\r\n" } else { "\n" });
            }
        }
        text
    })
}

/// 64 cases from a random seed, or from `SNAPFLOW_SEED` when it is set.
fn proptest_config() -> ProptestConfig {
    let mut config = ProptestConfig::with_cases(64);
    if let Ok(seed) = std::env::var("SNAPFLOW_SEED") {
        let seed = seed.parse().expect("SNAPFLOW_SEED must be an integer");
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(seed);
    }
    config
}

proptest! {
    // proptest prints the failing input and records it in
    // `source.proptest-regressions`, which replays it first on the next run;
    // SNAPFLOW_SEED (or PROPTEST_RNG_SEED) replays a whole run.
    #![proptest_config(proptest_config())]

    #[test]
    fn file_source_resumes_after_a_random_cut(
        contents in file_contents(),
        parallelism in 1_usize..=4,
        cut_fraction in 0.0_f64..=1.0,
        batch_records in 1_usize..8,
    ) {
        let file = write_file(contents.as_bytes());
        let factory = FileLinesSourceFactory::new(file.path());
        let mut all = Vec::new();
        for subtask in 0..parallelism {
            let mut source = factory.split(subtask, parallelism).unwrap();
            let whole = drain(&mut source, batch_records);
            let cut = (whole.len() as f64 * cut_fraction) as usize;
            let mut first = factory.split(subtask, parallelism).unwrap();
            let head = take(&mut first, cut, batch_records);
            let position = first.position();
            drop(first);
            let mut restored = factory.split(subtask, parallelism).unwrap();
            restored.seek(&position).unwrap();
            let mut resumed = head;
            resumed.extend(drain(&mut restored, batch_records));
            prop_assert_eq!(&resumed, &whole);
            all.extend(whole);
        }
        prop_assert_eq!(all, expected_lines(&contents));
    }
}

#[test]
fn file_that_shrinks_after_the_split_is_a_typed_error() {
    let file = write_file(b"abc\ndef\n");
    let mut source = FileLinesSourceFactory::new(file.path())
        .split(0, 1)
        .unwrap();
    std::fs::write(file.path(), b"abc\n").unwrap();
    let mut out = Vec::new();
    assert_eq!(
        source.poll_batch(&mut out, 10).unwrap(),
        SourcePoll::Produced(1)
    );
    let error = source.poll_batch(&mut out, 10).unwrap_err();
    assert!(
        matches!(error, SourceError::FileChanged { offset_bytes: 4 }),
        "{error}"
    );
}

#[test]
fn generator_poll_reuses_the_callers_buffer() {
    let factory = GeneratorSourceFactory::new(0..100_000, |index| index);
    let mut source = factory.split(0, 1).unwrap();
    let mut out = Vec::with_capacity(1024);
    let buffer = out.as_ptr();
    for _ in 0..50 {
        out.clear();
        assert_eq!(
            source.poll_batch(&mut out, 1024).unwrap(),
            SourcePoll::Produced(1024)
        );
        assert_eq!(
            out.as_ptr(),
            buffer,
            "a batch that fits must not reallocate"
        );
    }
}

/// A source that cannot rewind, as a user might write for a socket.
struct Counter {
    next: u64,
}

impl Source for Counter {
    type Item = u64;

    fn poll_batch(
        &mut self,
        out: &mut Vec<u64>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if max_records == 0 {
            return Ok(SourcePoll::Idle);
        }
        out.push(self.next);
        self.next += 1;
        Ok(SourcePoll::Produced(1))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::default()
    }

    fn seek(&mut self, _position: &SourcePosition) -> Result<(), SourceError> {
        Err(SourceError::SeekUnsupported)
    }

    fn can_seek(&self) -> bool {
        false
    }
}

#[test]
fn a_source_that_cannot_seek_reports_at_least_once() {
    use snapflow::source::Guarantee;
    let counter = Counter { next: 0 };
    assert_eq!(counter.guarantee(), Guarantee::AtLeastOnce);
    let vec_source = VecSourceFactory::new(vec![1]).split(0, 1).unwrap();
    assert_eq!(vec_source.guarantee(), Guarantee::ExactlyOnce);
}

/// A runtime shares factories between arbiter threads and moves sources
/// into them; these bounds must hold for the built-ins.
#[test]
fn built_in_sources_can_cross_threads() {
    fn shared<T: Send + Sync + 'static>(_: &T) {}
    fn movable<T: Send + 'static>(_: &T) {}
    let vec_factory = VecSourceFactory::new(vec![1_u8]);
    shared(&vec_factory);
    movable(&vec_factory.split(0, 1).unwrap());
    let generator = GeneratorSourceFactory::new(0..1, |index| index);
    shared(&generator);
    movable(&generator.split(0, 1).unwrap());
    let file = write_file(b"x\n");
    let lines = FileLinesSourceFactory::new(file.path());
    shared(&lines);
    movable(&lines.split(0, 1).unwrap());
    let iter = IterSourceFactory::new(|| 0..3);
    shared(&iter);
    movable(&iter.split(0, 1).unwrap());
}

/// A runtime may hold sources as trait objects: one virtual call per batch,
/// never per record.
#[test]
fn sources_work_as_trait_objects() {
    let sources: Vec<Box<dyn Source<Item = u64>>> = vec![
        Box::new(VecSourceFactory::new(vec![0, 1, 2]).split(0, 1).unwrap()),
        Box::new(
            GeneratorSourceFactory::new(0..3, |index| index)
                .split(0, 1)
                .unwrap(),
        ),
        Box::new(IterSourceFactory::new(|| 0..3_u64).split(0, 1).unwrap()),
    ];
    for mut source in sources {
        let mut out = Vec::new();
        while source.poll_batch(&mut out, 2).unwrap() != SourcePoll::Ended {}
        assert_eq!(out, [0, 1, 2]);
    }
}
