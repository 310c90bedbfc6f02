//! A sink that prints each record on its own line, to stdout or any writer.
//!
//! It owns a buffered writer and the count of bytes it printed (its
//! [`Sink::bytes_written`]: the bytes of every line, newline included,
//! as handed to the buffer; what a failed write leaves out is not
//! counted). It cannot take output back,
//! so it is at-least-once: records printed after the last completed
//! checkpoint are printed again after a restore. It never pretends
//! otherwise ([`Sink::guarantee`] says so).

use std::fmt::Display;
use std::io::{self, BufWriter, Stdout, Write};
use std::marker::PhantomData;

use super::{Guarantee, Sink, SinkError, SinkState};

/// Prints records with `Display`, one per line, buffered; flushes at every
/// pre-commit and at finish.
///
/// ```
/// use snapflow::sink::{PrintSink, Sink};
///
/// let mut sink = PrintSink::new(Vec::new());
/// sink.write_batch(&[1, 2])?;
/// sink.pre_commit(1)?;
/// assert_eq!(sink.bytes_written(), Some(4));
/// assert_eq!(sink.into_inner()?, b"1\n2\n");
/// # Ok::<(), snapflow::sink::SinkError>(())
/// ```
#[derive(Debug)]
pub struct PrintSink<T, W: Write> {
    writer: BufWriter<W>,
    /// The bytes of the lines printed so far.
    bytes_written: u64,
    _records: PhantomData<fn(&T)>,
}

impl<T> PrintSink<T, Stdout> {
    /// A sink printing to the process's standard output.
    pub fn stdout() -> Self {
        PrintSink::new(io::stdout())
    }
}

impl<T, W: Write> PrintSink<T, W> {
    /// A sink printing to `writer`.
    pub fn new(writer: W) -> Self {
        PrintSink {
            writer: BufWriter::new(writer),
            bytes_written: 0,
            _records: PhantomData,
        }
    }

    /// Flushes and returns the writer.
    ///
    /// # Errors
    ///
    /// [`SinkError::Io`] when the final flush fails.
    pub fn into_inner(self) -> Result<W, SinkError> {
        self.writer
            .into_inner()
            .map_err(|error| io_error(error.into_error()))
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        self.writer.flush().map_err(io_error)
    }
}

fn io_error(source: io::Error) -> SinkError {
    SinkError::Output { source }
}

/// A writer that counts the bytes the one below it accepted, so that a
/// line is counted as `write!` formats it, without formatting it twice.
struct Counting<'a, W> {
    inner: &'a mut W,
    bytes: &'a mut u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        *self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<T: Display, W: Write> Sink for PrintSink<T, W> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        let mut counting = Counting {
            inner: &mut self.writer,
            bytes: &mut self.bytes_written,
        };
        for record in batch {
            writeln!(counting, "{record}").map_err(io_error)?;
        }
        Ok(())
    }

    fn bytes_written(&self) -> Option<u64> {
        Some(self.bytes_written)
    }

    fn pre_commit(&mut self, _checkpoint_id: u64) -> Result<SinkState, SinkError> {
        self.flush()?;
        Ok(SinkState::default())
    }

    fn commit(&mut self, _checkpoint_id: u64) -> Result<(), SinkError> {
        Ok(())
    }

    fn abort(&mut self) -> Result<(), SinkError> {
        // What is printed is printed; flushing at least shows it all.
        self.flush()
    }

    fn restore(&mut self, _state: Option<&SinkState>) -> Result<(), SinkError> {
        Ok(())
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.flush()
    }

    fn guarantee(&self) -> Guarantee {
        Guarantee::AtLeastOnce
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_are_the_bytes_printed() {
        let mut sink = PrintSink::new(Vec::new());
        assert_eq!(sink.bytes_written(), Some(0));
        sink.write_batch(&["a", "héllo", ""]).expect("writes");
        sink.write_batch(&["last line"]).expect("writes");
        let counted = sink.bytes_written().expect("counted");
        let printed = sink.into_inner().expect("flushes");
        assert_eq!(printed, "a\nhéllo\n\nlast line\n".as_bytes());
        assert_eq!(counted, printed.len() as u64);
    }
}
