//! A deterministic generator source: record `i` is `generate(i)` for every
//! `i` in a range, and the position is the next index.
//!
//! It owns only a range and a function. It is what throughput benchmarks
//! read from, so a batch is one tight, monomorphised loop with no allocation
//! beyond growing the caller's vector.

use std::ops::Range;

use super::{
    split_range, Source, SourceError, SourceFactory, SourceFigures, SourcePoll, SourcePosition,
};

/// Gives each subtask a contiguous share of the index range.
///
/// ```
/// use snapflow::source::{GeneratorSourceFactory, Source, SourceFactory};
///
/// let factory = GeneratorSourceFactory::new(0..1_000, |index| index % 10);
/// let mut source = factory.split(0, 1).unwrap();
/// let mut out = Vec::with_capacity(1024);
/// source.poll_batch(&mut out, 1024).unwrap();
/// assert_eq!(out.len(), 1_000);
/// assert_eq!(out[13], 3);
/// ```
#[derive(Debug, Clone)]
pub struct GeneratorSourceFactory<F> {
    range: Range<u64>,
    generate: F,
}

impl<T, F: Fn(u64) -> T + Clone> GeneratorSourceFactory<F> {
    /// A factory producing `generate(i)` for every `i` in `range`, in order.
    pub fn new(range: Range<u64>, generate: F) -> Self {
        GeneratorSourceFactory { range, generate }
    }
}

impl<T, F: Fn(u64) -> T + Clone> SourceFactory for GeneratorSourceFactory<F> {
    type Source = GeneratorSource<F>;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<GeneratorSource<F>, SourceError> {
        let range = split_range(self.range.clone(), subtask, parallelism)?;
        Ok(GeneratorSource {
            start: range.start,
            next: range.start,
            end: range.end,
            generate: self.generate.clone(),
        })
    }
}

/// One subtask's share of a generator's range.
#[derive(Debug, Clone)]
pub struct GeneratorSource<F> {
    start: u64,
    next: u64,
    end: u64,
    generate: F,
}

impl<T, F: Fn(u64) -> T> Source for GeneratorSource<F> {
    type Item = T;

    fn poll_batch(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if self.next >= self.end {
            return Ok(SourcePoll::Ended);
        }
        let wanted = u64::try_from(max_records).unwrap_or(u64::MAX);
        let stop = self.end.min(self.next.saturating_add(wanted));
        // A `Range<u64>` mapped is an exact-size iterator, so `extend`
        // reserves once and writes in a tight loop.
        out.extend((self.next..stop).map(&self.generate));
        let produced = (stop - self.next) as usize;
        self.next = stop;
        Ok(SourcePoll::Produced(produced))
    }

    /// The records of this share not read yet.
    fn figures(&mut self) -> SourceFigures {
        SourceFigures {
            pending_records: Some(self.end.saturating_sub(self.next)),
            ..SourceFigures::default()
        }
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let index = position.to_index()?;
        if index < self.start || index > self.end {
            return Err(SourceError::PositionOutOfSplit {
                position: index,
                start: self.start,
                end: self.end,
            });
        }
        self.next = index;
        Ok(())
    }
}
