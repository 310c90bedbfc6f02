//! A sink that prints each record on its own line, to stdout or any writer.
//!
//! It owns a buffered writer and nothing else. It cannot take output back,
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
/// assert_eq!(sink.into_inner()?, b"1\n2\n");
/// # Ok::<(), snapflow::sink::SinkError>(())
/// ```
#[derive(Debug)]
pub struct PrintSink<T, W: Write> {
    writer: BufWriter<W>,
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

impl<T: Display, W: Write> Sink for PrintSink<T, W> {
    type Item = T;

    fn write_batch(&mut self, batch: &[T]) -> Result<(), SinkError> {
        for record in batch {
            writeln!(self.writer, "{record}").map_err(io_error)?;
        }
        Ok(())
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
