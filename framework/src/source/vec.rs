//! A source over an in-memory vector, with the record index as position.
//!
//! It owns nothing but a shared, read-only copy of the records; it never
//! copies the vector per subtask.

use std::sync::Arc;

use super::{
    split_range, Source, SourceError, SourceFactory, SourceFigures, SourcePoll, SourcePosition,
};

/// Gives each subtask a contiguous share of a vector.
///
/// ```
/// use snapflow::source::{Source, SourceFactory, SourcePoll, VecSourceFactory};
///
/// let factory = VecSourceFactory::new(vec![1, 2, 3, 4, 5]);
/// let mut second_half = factory.split(1, 2).unwrap();
/// let mut out = Vec::new();
/// assert_eq!(second_half.poll_batch(&mut out, 10).unwrap(), SourcePoll::Produced(3));
/// assert_eq!(out, [3, 4, 5]);
/// ```
#[derive(Debug, Clone)]
pub struct VecSourceFactory<T> {
    records: Arc<[T]>,
}

impl<T> VecSourceFactory<T> {
    /// A factory over these records.
    pub fn new(records: Vec<T>) -> Self {
        VecSourceFactory {
            records: records.into(),
        }
    }
}

impl<T: Clone> SourceFactory for VecSourceFactory<T> {
    type Source = VecSource<T>;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<VecSource<T>, SourceError> {
        let range = split_range(0..self.records.len() as u64, subtask, parallelism)?;
        Ok(VecSource {
            records: Arc::clone(&self.records),
            start: range.start as usize,
            next: range.start as usize,
            end: range.end as usize,
        })
    }
}

/// One subtask's share of a vector. Its position is the index (into the
/// whole vector) of the next record.
#[derive(Debug, Clone)]
pub struct VecSource<T> {
    records: Arc<[T]>,
    start: usize,
    next: usize,
    end: usize,
}

impl<T: Clone> Source for VecSource<T> {
    type Item = T;

    fn poll_batch(
        &mut self,
        out: &mut Vec<T>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        if self.next >= self.end {
            return Ok(SourcePoll::Ended);
        }
        let stop = self.end.min(self.next.saturating_add(max_records));
        out.extend_from_slice(&self.records[self.next..stop]);
        let produced = stop - self.next;
        self.next = stop;
        Ok(SourcePoll::Produced(produced))
    }

    /// The records of this share not read yet.
    fn figures(&mut self) -> SourceFigures {
        SourceFigures {
            pending_records: Some((self.end.saturating_sub(self.next)) as u64),
            ..SourceFigures::default()
        }
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next as u64)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let index = position.to_index()?;
        if index < self.start as u64 || index > self.end as u64 {
            return Err(SourceError::PositionOutOfSplit {
                position: index,
                start: self.start as u64,
                end: self.end as u64,
            });
        }
        self.next = index as usize;
        Ok(())
    }
}
