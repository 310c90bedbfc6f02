//! One key's open windows and the two moves on them: adding a record
//! (to its fixed windows, or merging session windows) and firing what a
//! timer marks. Windows are per-key state and their firings and
//! clean-ups are event-time timers, so both are in the snapshot and
//! rescale by key group; a window is removed once the watermark passes
//! its end plus the allowed lateness.
//!
//! It never decides what a window computes (`window_fn`) and never
//! declares an operator (`windowed`).

use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

use crate::job::{Collector, Data};
use crate::runtime::BoxError;
use crate::state::{FieldSchema, Schema, SchemaShape, Snapshot, StateError};

use super::timers::Timers;
use super::window::{WindowKind, Windowed, Windows};
use super::window_fn::WindowFunction;

/// One open window: its first and last event time and its contents.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct OpenWindow<C> {
    start_ms: u64,
    last_ms: u64,
    contents: C,
}

/// One key's open windows, by start, never overlapping for sessions.
///
/// The first window is kept inline, in the keyed state's table entry
/// (moved back there when a firing leaves one window): a tumbling
/// window's key mostly has one open window, and the window benchmark
/// measured the read of a separate heap buffer as half of the per-record
/// window add. Its snapshot is written by hand, with exactly
/// the schema and bytes the derived form of `{ windows: Vec<OpenWindow<C>> }`
/// had, so stored windows stay readable (a test checks both).
#[derive(Clone)]
pub(crate) struct OpenWindows<C> {
    windows: SmallVec<[OpenWindow<C>; 1]>,
}

impl<C> Default for OpenWindows<C> {
    fn default() -> Self {
        OpenWindows {
            windows: SmallVec::new(),
        }
    }
}

impl<C: Serialize + DeserializeOwned> Snapshot for OpenWindows<C> {
    const SCHEMA: Schema = Schema {
        type_name: "OpenWindows",
        version: 1,
        shape: SchemaShape::Named(&[FieldSchema {
            name: "windows",
            type_name: "Vec<OpenWindow<C>>",
        }]),
    };

    fn encode_payload(&self, out: &mut Vec<u8>) -> Result<(), StateError> {
        // A slice is encoded as a `Vec` is: its length, then its items.
        crate::__private::encode_field("OpenWindows", self.windows.as_slice(), out)
    }

    fn decode_payload(payload: &[u8]) -> Result<Self, StateError> {
        let mut input = payload;
        let windows: Vec<OpenWindow<C>> =
            crate::__private::decode_field("OpenWindows", &mut input)?;
        crate::__private::finish("OpenWindows", input)?;
        Ok(OpenWindows {
            windows: SmallVec::from_vec(windows),
        })
    }
}

impl<C> OpenWindows<C> {
    /// No window is open: the key's state can go.
    pub(crate) fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

/// The window moves for one key: which windows, what they compute, and
/// how a result becomes the operator's output `O` (records are `T`).
pub(crate) struct Adding<'a, K, T, W, E, O> {
    windows: &'a Windows,
    function: &'a W,
    key: &'a K,
    /// Turns a result into the operator's output.
    wrap: &'a E,
    _records: PhantomData<fn(T) -> O>,
}

impl<'a, K, T, W, E, O> Adding<'a, K, T, W, E, O>
where
    K: Data,
    T: Clone,
    W: WindowFunction<K, T>,
    E: Fn(Windowed<K, W::Output>) -> O,
    O: Clone + Send + 'static,
{
    /// The moves of `key`'s windows.
    pub(crate) fn new(windows: &'a Windows, function: &'a W, key: &'a K, wrap: &'a E) -> Self {
        Adding {
            windows,
            function,
            key,
            wrap,
            _records: PhantomData,
        }
    }

    /// Adds `record` at `timestamp_ms` to `open`; gives it back when every
    /// window it would belong to is past its lateness (the record is late
    /// and left out). A window that already fired and takes the record within
    /// its lateness fires again at once (a late firing).
    ///
    /// Inlined into the timed core's per-record loop with the tumbling
    /// fast path; the general paths are calls of their own, so the loop
    /// stays small.
    #[inline(always)]
    pub(crate) fn add(
        &self,
        open: &mut OpenWindows<W::Contents>,
        (timestamp_ms, record): (u64, T),
        timers: &mut Timers<'_>,
        out: &mut Collector<'_, O>,
    ) -> Result<Option<T>, BoxError> {
        match self.windows.kind() {
            WindowKind::Fixed { size_ms, slide_ms } if size_ms == slide_ms => {
                match self.add_to_newest(open, (timestamp_ms, record), timers, out)? {
                    Some(record) => self.add_fixed(open, (timestamp_ms, record), timers, out),
                    None => Ok(None),
                }
            }
            WindowKind::Fixed { .. } => self.add_fixed(open, (timestamp_ms, record), timers, out),
            WindowKind::Session { .. } => {
                self.add_session(open, (timestamp_ms, record), timers, out)
            }
        }
    }

    /// The tumbling fast path: a record mostly falls into its key's
    /// newest window, which is then the only window it belongs to, found
    /// by comparing times. That skips the assigner's division and search
    /// (a per-record cost the window benchmark measured). Gives the record
    /// back when it falls elsewhere.
    #[inline(always)]
    fn add_to_newest(
        &self,
        open: &mut OpenWindows<W::Contents>,
        (timestamp_ms, record): (u64, T),
        timers: &mut Timers<'_>,
        out: &mut Collector<'_, O>,
    ) -> Result<Option<T>, BoxError> {
        let Some(newest) = open.windows.last_mut() else {
            return Ok(Some(record));
        };
        if timestamp_ms < newest.start_ms || timestamp_ms > newest.last_ms {
            return Ok(Some(record));
        }
        let passed = passed_by(timers.fired_through_ms(self.windows.domain()));
        // An open window is never past its lateness (its clean-up timer
        // removes it first); the general path decides if it ever were.
        if passed(self.windows.cleanup_ms(newest.last_ms)) {
            return Ok(Some(record));
        }
        self.function.add(&mut newest.contents, record)?;
        if passed(newest.last_ms) {
            out.emit(self.result(newest)?);
        }
        Ok(None)
    }

    #[inline(never)]
    fn add_fixed(
        &self,
        open: &mut OpenWindows<W::Contents>,
        (timestamp_ms, record): (u64, T),
        timers: &mut Timers<'_>,
        out: &mut Collector<'_, O>,
    ) -> Result<Option<T>, BoxError> {
        let windows = self.windows;
        let passed = passed_by(timers.fired_through_ms(windows.domain()));
        let mut added = false;
        for start_ms in windows.starts_of(timestamp_ms) {
            let last_ms = windows.last_ms(start_ms);
            if passed(windows.cleanup_ms(last_ms)) {
                continue;
            }
            added = true;
            // Records mostly fall into a key's newest window: look there
            // before searching.
            let found = match open.windows.last() {
                Some(newest) if newest.start_ms == start_ms => Ok(open.windows.len() - 1),
                _ => open
                    .windows
                    .binary_search_by_key(&start_ms, |window| window.start_ms),
            };
            let at = match found {
                Ok(at) => at,
                Err(at) => {
                    open.windows.insert(
                        at,
                        OpenWindow {
                            start_ms,
                            last_ms,
                            contents: W::Contents::default(),
                        },
                    );
                    register(windows, last_ms, timers, &passed);
                    at
                }
            };
            let window = &mut open.windows[at];
            self.function.add(&mut window.contents, record.clone())?;
            if passed(last_ms) {
                out.emit(self.result(window)?);
            }
        }
        Ok((!added).then_some(record))
    }

    /// A record opens `[ts, ts + gap)`; every open window that overlaps
    /// or touches it merges with it into one.
    #[inline(never)]
    fn add_session(
        &self,
        open: &mut OpenWindows<W::Contents>,
        (timestamp_ms, record): (u64, T),
        timers: &mut Timers<'_>,
        out: &mut Collector<'_, O>,
    ) -> Result<Option<T>, BoxError> {
        let windows = self.windows;
        let passed = passed_by(timers.fired_through_ms(windows.domain()));
        let (mut start_ms, mut last_ms) = (timestamp_ms, windows.last_ms(timestamp_ms));
        let touches = |window: &OpenWindow<W::Contents>, start_ms: u64, last_ms: u64| {
            window.start_ms <= last_ms.saturating_add(1)
                && window.last_ms.saturating_add(1) >= start_ms
        };
        // Open windows never overlap and are sorted, so the ones the new
        // window touches are one run; the merged window can touch no
        // other (it only spans what the run and the record spanned).
        let first = open
            .windows
            .iter()
            .position(|window| touches(window, start_ms, last_ms));
        let Some(first) = first else {
            // Every open window is within its lateness, so a merged window
            // never is late; a window of the record alone may be.
            if passed(windows.cleanup_ms(last_ms)) {
                return Ok(Some(record));
            }
            let at = open
                .windows
                .partition_point(|window| window.start_ms < start_ms);
            let mut contents = W::Contents::default();
            self.function.add(&mut contents, record)?;
            open.windows.insert(
                at,
                OpenWindow {
                    start_ms,
                    last_ms,
                    contents,
                },
            );
            register(windows, last_ms, timers, &passed);
            if passed(last_ms) {
                out.emit(self.result(&open.windows[at])?);
            }
            return Ok(None);
        };
        let end = first
            + open.windows[first..]
                .iter()
                .take_while(|window| touches(window, start_ms, last_ms))
                .count();
        let mut merged = open.windows.drain(first..end);
        let mut window = merged
            .next()
            .unwrap_or_else(|| unreachable!("the run holds `first`"));
        timers.delete_ms(windows.domain(), window.last_ms);
        timers.delete_ms(windows.domain(), windows.cleanup_ms(window.last_ms));
        for other in merged {
            window.last_ms = window.last_ms.max(other.last_ms);
            timers.delete_ms(windows.domain(), other.last_ms);
            timers.delete_ms(windows.domain(), windows.cleanup_ms(other.last_ms));
            self.function.merge(&mut window.contents, other.contents)?;
        }
        start_ms = start_ms.min(window.start_ms);
        last_ms = last_ms.max(window.last_ms);
        (window.start_ms, window.last_ms) = (start_ms, last_ms);
        self.function.add(&mut window.contents, record)?;
        open.windows.insert(first, window);
        // A deleted time may be another window's too (a timer is one per
        // key and time): every window registers again, deduplicated.
        for window in &open.windows {
            register(windows, window.last_ms, timers, &passed);
        }
        if passed(last_ms) {
            out.emit(self.result(&open.windows[first])?);
        }
        Ok(None)
    }

    /// Fires the windows whose last event time is `timestamp_ms` and
    /// removes those whose lateness ends there (or earlier).
    pub(crate) fn fire(
        &self,
        open: &mut OpenWindows<W::Contents>,
        timestamp_ms: u64,
        out: &mut Collector<'_, O>,
    ) -> Result<(), BoxError> {
        for window in &open.windows {
            if window.last_ms == timestamp_ms {
                out.emit(self.result(window)?);
            }
        }
        let windows = self.windows;
        open.windows
            .retain(|window| windows.cleanup_ms(window.last_ms) > timestamp_ms);
        // A key held two windows for a moment (the next one opened before
        // this one fired): move the one left back inline, or the key would
        // read a heap buffer for every record from now on.
        if open.windows.spilled() && open.windows.len() <= open.windows.inline_size() {
            open.windows.shrink_to_fit();
        }
        Ok(())
    }

    fn result(&self, window: &OpenWindow<W::Contents>) -> Result<O, BoxError> {
        Ok((self.wrap)(Windowed {
            key: self.key.clone(),
            start_ms: window.start_ms,
            end_ms: window.last_ms.saturating_add(1),
            result: self.function.result(self.key, &window.contents)?,
        }))
    }
}

/// Whether the watermark has passed a time (nothing has, before the
/// first watermark).
fn passed_by(watermark_ms: Option<u64>) -> impl Fn(u64) -> bool {
    move |at_ms| watermark_ms.is_some_and(|watermark_ms| at_ms <= watermark_ms)
}

/// Registers the firing and the clean-up of a window ending at `last_ms`.
/// A window first opened within its lateness fires at once (late), not
/// again by a timer.
fn register(
    windows: &Windows,
    last_ms: u64,
    timers: &mut Timers<'_>,
    passed: &impl Fn(u64) -> bool,
) {
    let cleanup_ms = windows.cleanup_ms(last_ms);
    if !passed(last_ms) {
        timers.register_ms(windows.domain(), last_ms);
    }
    // Without lateness the firing is the clean-up: one timer, not a
    // second one deduplicated (a timer costs two table lookups).
    if cleanup_ms != last_ms || passed(last_ms) {
        timers.register_ms(windows.domain(), cleanup_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The derived form the hand-written snapshot must match.
    #[derive(crate::Snapshot, Clone)]
    #[snapshot(crate = "crate")]
    struct Derived<C> {
        windows: Vec<OpenWindow<C>>,
    }

    fn window(start_ms: u64, contents: u64) -> OpenWindow<u64> {
        OpenWindow {
            start_ms,
            last_ms: start_ms + 999,
            contents,
        }
    }

    #[test]
    fn open_windows_are_stored_as_the_derived_form_was() {
        let mut schema = <Derived<u64> as Snapshot>::SCHEMA;
        schema.type_name = "OpenWindows";
        assert_eq!(schema, <OpenWindows<u64> as Snapshot>::SCHEMA);
        for count in [0, 1, 3] {
            let windows: Vec<_> = (0..count).map(|i| window(i * 1_000, i + 7)).collect();
            let derived = Derived {
                windows: windows.clone(),
            };
            let inline = OpenWindows {
                windows: SmallVec::from_vec(windows),
            };
            let (mut want, mut got) = (Vec::new(), Vec::new());
            derived.encode_payload(&mut want).expect("encodes");
            inline.encode_payload(&mut got).expect("encodes");
            assert_eq!(got, want, "{count} windows");
            let back = OpenWindows::<u64>::decode_payload(&got).expect("decodes");
            let starts: Vec<u64> = back.windows.iter().map(|w| w.start_ms).collect();
            assert_eq!(starts, (0..count).map(|i| i * 1_000).collect::<Vec<_>>());
        }
        assert!(
            OpenWindows::<u64>::decode_payload(&[1]).is_err(),
            "a cut payload is an error"
        );
    }
}
