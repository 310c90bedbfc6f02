//! A counting global allocator for the allocation-bound tests
//! (`blob_alloc`, `keyed_alloc`). Each of those files is its own test binary
//! and declares `mod alloc_support;`, which installs this allocator for that
//! binary only. Counters are per thread, so tests running in parallel do not
//! see each other's allocations.

// The workspace denies unsafe code. Implementing `GlobalAlloc` is unsafe by
// definition; the impl below only forwards to `System` and updates
// thread-local counters, and it is confined to these test binaries.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct CountingAllocator;

thread_local! {
    // Const-initialised cells without destructors: reading them from inside
    // the allocator never allocates and never registers a TLS destructor.
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
    static PEAK_BYTES: Cell<isize> = const { Cell::new(0) };
    static TOTAL_BYTES: Cell<usize> = const { Cell::new(0) };
}

fn record_alloc(size: usize) {
    let _ = LIVE_BYTES.try_with(|live| {
        live.set(live.get() + size as isize);
        let _ = PEAK_BYTES.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
    let _ = TOTAL_BYTES.try_with(|total| total.set(total.get() + size));
}

fn record_free(size: usize) {
    // Memory freed on another thread than it was allocated on makes a
    // thread's count drift, which is why the counter is signed; measured
    // closures run on one thread, so their differences stay exact.
    let _ = LIVE_BYTES.try_with(|live| live.set(live.get() - size as isize));
}

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            record_alloc(layout.size());
        }
        pointer
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let pointer = unsafe { System.alloc_zeroed(layout) };
        if !pointer.is_null() {
            record_alloc(layout.size());
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        unsafe { System.dealloc(pointer, layout) };
        record_free(layout.size());
    }

    unsafe fn realloc(&self, pointer: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let moved = unsafe { System.realloc(pointer, layout, new_size) };
        if !moved.is_null() {
            record_free(layout.size());
            record_alloc(new_size);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// What one measured closure allocated on this thread.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    /// The most bytes held at once, above what was held before the call.
    pub peak_bytes: usize,
    /// The sum of all allocation sizes (a `realloc` counts its new size).
    pub total_bytes: usize,
}

pub fn measure<R>(run: impl FnOnce() -> R) -> (R, Usage) {
    let start = LIVE_BYTES.with(Cell::get);
    PEAK_BYTES.with(|peak| peak.set(start));
    TOTAL_BYTES.with(|total| total.set(0));
    let result = run();
    let usage = Usage {
        peak_bytes: (PEAK_BYTES.with(Cell::get) - start).max(0) as usize,
        total_bytes: TOTAL_BYTES.with(Cell::get),
    };
    (result, usage)
}
