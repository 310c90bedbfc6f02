//! Throughput figures for the built-in connectors. These are benchmarks
//! that print, not tests: they assert only that every record arrived, and
//! they are `#[ignore]`d so the normal test run skips them. Run with
//!
//! ```sh
//! cargo test --release -p snapflow --test source_throughput -- --ignored --nocapture
//! ```

use std::io::{BufWriter, Write};
use std::time::Instant;

use snapflow::sink::{FileSinkFactory, Sink, SinkFactory};
use snapflow::source::{
    FileLinesSourceFactory, GeneratorSourceFactory, Source, SourceFactory, SourcePoll,
};

const BATCH_RECORDS: usize = 1024;

/// Drains `source` in batches, handing each batch to `consume`; returns the
/// record count.
fn drain<S: Source>(source: &mut S, mut consume: impl FnMut(&[S::Item])) -> u64 {
    let mut batch = Vec::with_capacity(BATCH_RECORDS);
    let mut records = 0;
    loop {
        batch.clear();
        match source.poll_batch(&mut batch, BATCH_RECORDS).expect("poll") {
            SourcePoll::Produced(count) => {
                records += count as u64;
                consume(&batch);
            }
            SourcePoll::Idle => continue,
            SourcePoll::Ended => return records,
        }
    }
}

fn report(what: &str, records: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{what}: {records} records in {seconds:.3} s = {:.1} M records/s",
        records as f64 / seconds / 1e6
    );
}

#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn generator_source_throughput() {
    let total = 50_000_000;
    let factory = GeneratorSourceFactory::new(0..total, |index| (index % 10_000, index));
    let mut source = factory.split(0, 1).expect("split");
    let mut checksum = 0_u64;
    let started = Instant::now();
    let records = drain(&mut source, |batch| {
        checksum = checksum.wrapping_add(batch[batch.len() - 1].0)
    });
    report(
        "generator source, (key, index) pairs, batch 1024",
        records,
        started,
    );
    assert_eq!(records, total);
    assert_ne!(checksum, 0);
}

#[test]
#[ignore = "benchmark; run with --release -- --ignored --nocapture"]
fn file_lines_source_and_file_sink_throughput() {
    let dir = tempfile::tempdir().expect("temp dir");
    let input = dir.path().join("input.txt");
    let total = 2_000_000_u64;
    let mut writer = BufWriter::new(std::fs::File::create(&input).expect("create"));
    for index in 0..total {
        writeln!(writer, "record number {index}").expect("write");
    }
    writer.flush().expect("flush");
    drop(writer);

    let mut source = FileLinesSourceFactory::new(&input)
        .split(0, 1)
        .expect("split");
    let started = Instant::now();
    let records = drain(&mut source, |_| {});
    report("file lines source, ~20-byte lines", records, started);
    assert_eq!(records, total);

    let output = dir.path().join("output");
    let mut sink = FileSinkFactory::<String, _>::lines(&output)
        .expect("factory")
        .create(0, 1)
        .expect("sink");
    sink.restore(None).expect("restore");
    let mut source = FileLinesSourceFactory::new(&input)
        .split(0, 1)
        .expect("split");
    let started = Instant::now();
    let records = drain(&mut source, |batch| sink.write_batch(batch).expect("write"));
    sink.pre_commit(1).expect("pre-commit");
    sink.commit(1).expect("commit");
    report(
        "file lines source into file sink, one checkpoint with fsync",
        records,
        started,
    );
    assert_eq!(
        std::fs::metadata(output.join("part-0-1"))
            .expect("output")
            .len(),
        std::fs::metadata(&input).expect("input").len()
    );
}
