//! A source over any iterator that can be made again from the start, with
//! the count of items taken from the iterator as the position.
//!
//! It owns a function that makes the iterator. Seeking makes a fresh
//! iterator and skips to the position, so a seek costs time linear in the
//! position: fine for tests and small inputs, the wrong choice for a large
//! input that has a direct way to seek (write a `Source` for it instead).

use super::{check_split, Source, SourceError, SourceFactory, SourcePoll, SourcePosition};

/// Gives subtask `s` of `p` the items at indices `s, s + p, s + 2p, ...` of
/// the iterator, because the iterator's length is not known in advance.
///
/// ```
/// use snapflow::source::{IterSourceFactory, Source, SourceFactory};
///
/// let factory = IterSourceFactory::new(|| "a b c d e".split(' ').map(String::from));
/// let mut odd = factory.split(1, 2).unwrap();
/// let mut out = Vec::new();
/// odd.poll_batch(&mut out, 10).unwrap();
/// assert_eq!(out, ["b", "d"]);
/// ```
#[derive(Debug, Clone)]
pub struct IterSourceFactory<F> {
    make: F,
}

impl<I: IntoIterator, F: Fn() -> I + Clone> IterSourceFactory<F> {
    /// A factory whose iterator is `make()`; `make` must return the same
    /// sequence every time, or a restore replays different records.
    pub fn new(make: F) -> Self {
        IterSourceFactory { make }
    }
}

impl<I: IntoIterator, F: Fn() -> I + Clone> SourceFactory for IterSourceFactory<F> {
    type Source = IterSource<I::IntoIter, F>;

    fn split(&self, subtask: usize, parallelism: usize) -> Result<Self::Source, SourceError> {
        check_split(subtask, parallelism)?;
        let mut source = IterSource {
            iter: (self.make)().into_iter(),
            make: self.make.clone(),
            subtask: subtask as u64,
            parallelism: parallelism as u64,
            next: 0,
            ended: false,
        };
        source.advance_to(subtask as u64);
        Ok(source)
    }
}

/// One subtask's items of an iterator. Its position is the index (in the
/// whole iterator) of the next item it will produce.
#[derive(Debug, Clone)]
pub struct IterSource<I, F> {
    iter: I,
    make: F,
    subtask: u64,
    parallelism: u64,
    /// Index, in the whole iterator, of the item `iter` yields next.
    next: u64,
    ended: bool,
}

impl<I: Iterator, F> IterSource<I, F> {
    /// Skips items until `iter` is at `index`; marks the end if it runs
    /// out. `next` becomes `index` either way, so the position of an ended
    /// source still belongs to this subtask and can be sought back to.
    fn advance_to(&mut self, index: u64) {
        while !self.ended && self.next < index {
            if self.iter.next().is_none() {
                self.ended = true;
            } else {
                self.next += 1;
            }
        }
        self.next = index;
    }
}

impl<I, F> Source for IterSource<I::IntoIter, F>
where
    I: IntoIterator,
    F: Fn() -> I,
{
    type Item = I::Item;

    fn poll_batch(
        &mut self,
        out: &mut Vec<I::Item>,
        max_records: usize,
    ) -> Result<SourcePoll, SourceError> {
        let mut produced = 0;
        while produced < max_records && !self.ended {
            match self.iter.next() {
                Some(item) => {
                    out.push(item);
                    produced += 1;
                    self.next += 1;
                    let target = self.next + self.parallelism - 1;
                    self.advance_to(target);
                }
                None => self.ended = true,
            }
        }
        if produced == 0 && self.ended {
            return Ok(SourcePoll::Ended);
        }
        Ok(SourcePoll::Produced(produced))
    }

    fn position(&self) -> SourcePosition {
        SourcePosition::from_index(self.next)
    }

    fn seek(&mut self, position: &SourcePosition) -> Result<(), SourceError> {
        let index = position.to_index()?;
        if index % self.parallelism != self.subtask {
            return Err(SourceError::ForeignPosition {
                position: index,
                subtask: self.subtask as usize,
                parallelism: self.parallelism as usize,
            });
        }
        self.iter = (self.make)().into_iter();
        self.next = 0;
        self.ended = false;
        self.advance_to(index);
        Ok(())
    }
}
