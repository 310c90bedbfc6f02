//! [`SliceTable`]: the hash table of one copy-on-write slice, whose
//! allocator remembers where the table's memory is, so that a batch loop
//! can prefetch the memory a key's lookup will touch a few records before
//! it looks the key up ([`prefetch`]).
//!
//! This module owns that allocator and the prefetch. It never reads or
//! writes a table's entries, never decides which keys to prefetch (the
//! keyed batch loop does) and never changes how the table hashes or
//! probes: hashbrown does all of that as before.
//!
//! # Why
//!
//! With millions of keys per subtask a lookup misses the caches twice (the
//! probe's control bytes and the bucket), and the keyed batch loop spent
//! most of its time waiting on those loads (BENCHMARKS.md at 07a44e5, "Prefetching
//! the copy-on-write tables"). The records of a batch are all known up front, so
//! the loop can ask for the lines of the key eight records ahead while it
//! works on the current one, and the misses overlap instead of following
//! one another.
//!
//! # What it relies on
//!
//! hashbrown 0.14's layout of a table's single allocation: `buckets`
//! slots of `T` growing down from the control bytes, which start at the
//! slots' size rounded up to the control alignment, then `buckets + 16`
//! control bytes; and a probe that starts at `hash & (buckets - 1)`. The
//! allocator learns the allocation's size and recovers `buckets` from it.
//! If a later hashbrown laid tables out otherwise, the prefetched lines
//! would be the wrong ones: slower, never wrong, since a prefetch is a
//! hint that reads nothing and cannot fault. The tests check the
//! addresses against the table's own entries, so such a change fails
//! them.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use allocator_api2::alloc::{AllocError, Allocator, Global};
use hashbrown::HashTable;

/// The table of one slice of a copy-on-write keyed state.
pub(crate) type SliceTable<K, S> = HashTable<(K, S), SliceAlloc<(K, S)>>;

/// hashbrown's group width on the SSE2 and generic implementations: the
/// control bytes are `buckets + GROUP_WIDTH` long and aligned to it.
const GROUP_WIDTH: usize = 16;

/// The global allocator, remembering the one live allocation of the table
/// that owns it: where its control bytes start and its bucket mask.
///
/// A table allocates through its allocator only when it grows (the new
/// allocation is made before the old one is freed) and frees through it
/// when it shrinks or drops, so the newest allocation is the table's.
/// The fields are atomics only so that a table shared with a snapshot's
/// thread stays `Sync`; they change only while the table is borrowed
/// mutably (or cloned, which makes a fresh allocator), so relaxed order
/// suffices.
pub(crate) struct SliceAlloc<T> {
    /// The allocation's start, to recognise its deallocation.
    start: AtomicPtr<u8>,
    /// Where the control bytes start; null while nothing is allocated.
    control: AtomicPtr<u8>,
    bucket_mask: AtomicUsize,
    entry: PhantomData<fn() -> T>,
}

impl<T> Default for SliceAlloc<T> {
    fn default() -> Self {
        SliceAlloc {
            start: AtomicPtr::new(std::ptr::null_mut()),
            control: AtomicPtr::new(std::ptr::null_mut()),
            bucket_mask: AtomicUsize::new(0),
            entry: PhantomData,
        }
    }
}

/// A clone is the allocator of a new table (hashbrown clones a table's
/// allocator to allocate the copy), so it starts empty.
impl<T> Clone for SliceAlloc<T> {
    fn clone(&self) -> Self {
        SliceAlloc::default()
    }
}

impl<T> std::fmt::Debug for SliceAlloc<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceAlloc")
            .field("buckets", &(self.bucket_mask.load(Ordering::Relaxed) + 1))
            .finish()
    }
}

// SAFETY: every allocation and deallocation is the global allocator's,
// unchanged; this type only records addresses beside them. The one
// `unsafe` of the crate outside tests: the allocator trait is unsafe to
// implement, and hashbrown offers no other way to learn where a table's
// memory is.
#[allow(unsafe_code)]
unsafe impl<T> Allocator for SliceAlloc<T> {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let memory = Global.allocate(layout)?;
        let start = memory.cast::<u8>().as_ptr();
        match buckets_of::<T>(layout) {
            Some(buckets) => {
                self.start.store(start, Ordering::Relaxed);
                self.control.store(
                    start.wrapping_add(control_offset::<T>(buckets)),
                    Ordering::Relaxed,
                );
                self.bucket_mask.store(buckets - 1, Ordering::Relaxed);
            }
            // Not a table's layout as this module knows it: prefetch
            // nothing rather than the wrong lines.
            None => self.forget(),
        }
        Ok(memory)
    }

    #[allow(unsafe_code)]
    unsafe fn deallocate(&self, pointer: NonNull<u8>, layout: Layout) {
        if pointer.as_ptr() == self.start.load(Ordering::Relaxed) {
            self.forget();
        }
        // SAFETY: the caller's contract: `pointer` came from `allocate`
        // with `layout`, i.e. from `Global` with `layout`.
        unsafe { Global.deallocate(pointer, layout) }
    }
}

impl<T> SliceAlloc<T> {
    fn forget(&self) {
        self.start.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.control.store(std::ptr::null_mut(), Ordering::Relaxed);
        self.bucket_mask.store(0, Ordering::Relaxed);
    }
}

/// Where a table of `buckets` slots of `T` starts its control bytes.
fn control_offset<T>(buckets: usize) -> usize {
    let align = control_align::<T>();
    (std::mem::size_of::<T>() * buckets + align - 1) & !(align - 1)
}

fn control_align<T>() -> usize {
    std::mem::align_of::<T>().max(GROUP_WIDTH)
}

/// The number of buckets of the table whose allocation is `layout`, if it
/// is one a table of `T` makes.
fn buckets_of<T>(layout: Layout) -> Option<usize> {
    if layout.align() != control_align::<T>() {
        return None;
    }
    // Sizes grow with the buckets, so at most one power of two fits.
    (0..usize::BITS)
        .map(|bits| 1usize << bits)
        .take_while(|buckets| control_offset::<T>(*buckets) <= layout.size())
        .find(|buckets| control_offset::<T>(*buckets) + buckets + GROUP_WIDTH == layout.size())
}

/// Asks the CPU for the control bytes and the first bucket of `hash`'s
/// probe in `table`: where a lookup of `hash` starts. Nothing is read;
/// an empty table prefetches nothing.
#[inline(always)]
pub(crate) fn prefetch<T>(table: &HashTable<T, SliceAlloc<T>>, hash: u64) {
    if let Some((control, bucket)) = probe_start(table, hash) {
        prefetch_line(control);
        prefetch_line(bucket.cast());
    }
}

/// How far below an entry a scan of a table asks for memory: eight lines,
/// a few groups of buckets ahead of the one being read.
const SCAN_AHEAD_BYTES: usize = 512;

/// Asks the CPU for the memory a scan of a table (`HashTable::iter`) will
/// read a few groups after `entry`, the entry it is at: hashbrown's
/// iterator walks the buckets in index order, which lies downwards in
/// memory (the layout above), so the lines below `entry`. A scan of a
/// slice not in the caches otherwise waits on each of its lines in turn
/// (BENCHMARKS.md at 07a44e5, "Frozen hot slices encoded at the first write"; the
/// in-memory encoders use it too, "Prefetching the encoding scan"). An
/// address past the table's start prefetches nothing of use, and never
/// faults.
#[inline(always)]
pub(crate) fn prefetch_scan_ahead<T>(entry: &T) {
    let address: *const T = entry;
    prefetch_line(address.cast::<u8>().wrapping_sub(SCAN_AHEAD_BYTES));
}

/// Where a lookup of `hash` in `table` starts: its first control byte and
/// its first bucket, or `None` for a table with no memory. The addresses
/// are computed, never dereferenced.
#[inline(always)]
fn probe_start<T>(table: &HashTable<T, SliceAlloc<T>>, hash: u64) -> Option<(*const u8, *const T)> {
    let alloc = table.allocator();
    let control = alloc.control.load(Ordering::Relaxed);
    if control.is_null() {
        return None;
    }
    // hashbrown's `h1`: the low bits of the hash pick the first group.
    let position = (hash as usize) & alloc.bucket_mask.load(Ordering::Relaxed);
    let bucket = control.wrapping_sub((position + 1) * std::mem::size_of::<T>());
    Some((
        control.wrapping_add(position).cast_const(),
        bucket.cast_const().cast(),
    ))
}

/// Asks the CPU for the cache line at `address`, which need not be valid.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_line(address: *const u8) {
    // SAFETY: SSE, the intrinsic's target feature, is part of every
    // x86-64 target, and a prefetch is a hint: it never faults and reads
    // nothing into the program, whatever the address.
    #[allow(unsafe_code)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast());
    }
}

/// Asks the CPU for the cache line at `address` (a no-op off x86-64).
#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
pub(crate) fn prefetch_line(_address: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keyed::hash::key_hash;

    type Table = SliceTable<u64, u64>;

    fn insert(table: &mut Table, key: u64) {
        table.insert_unique(key_hash(&key), (key, key * 3), |(k, _)| key_hash(k));
    }

    /// The bucket `prefetch` would fetch for each key holds that key in
    /// most cases (the first bucket of its probe; collisions move a key
    /// further along), at every size the table grows through: if
    /// hashbrown's layout differed from what this module assumes, almost
    /// none would.
    fn check(keys: u64) {
        let mut table = Table::default();
        assert!(
            probe_start(&table, 1).is_none(),
            "an empty table has no probe"
        );
        for key in 0..keys {
            insert(&mut table, key);
        }
        let home = (0..keys)
            .filter(|key| {
                let (_, bucket) = probe_start(&table, key_hash(key)).expect("a table");
                let found = table
                    .find(key_hash(key), |(k, _)| k == key)
                    .expect("inserted");
                std::ptr::eq(bucket, found)
            })
            .count() as u64;
        assert!(
            home * 2 > keys,
            "only {home} of {keys} keys sit where their probe starts"
        );
    }

    #[test]
    fn the_probe_start_is_where_most_keys_sit() {
        for keys in [1, 7, 100, 1_000, 100_000] {
            check(keys);
        }
    }

    #[test]
    fn a_copy_knows_its_own_memory_and_a_freed_table_none() {
        let mut table = Table::default();
        for key in 0..1_000 {
            insert(&mut table, key);
        }
        let copy = table.clone();
        let (_, original) = probe_start(&table, key_hash(&5)).expect("a table");
        let (_, copied) = probe_start(&copy, key_hash(&5)).expect("a table");
        assert!(
            !std::ptr::eq(original, copied),
            "the copy has its own memory"
        );
        let found = copy.find(key_hash(&5), |(k, _)| *k == 5).expect("copied");
        assert_eq!(found.1, 15);
        table.clear();
        table.shrink_to(0, |(k, _)| key_hash(k));
        assert!(
            probe_start(&table, 1).is_none(),
            "the freed table still names memory"
        );
    }

    #[test]
    fn only_table_layouts_are_recognised() {
        let layout = |size, align| Layout::from_size_align(size, align).expect("a layout");
        assert_eq!(
            buckets_of::<(u64, u64)>(layout(16 * 8 + 8 + 16, 16)),
            Some(8)
        );
        assert_eq!(buckets_of::<(u64, u64)>(layout(100, 16)), None);
        assert_eq!(buckets_of::<(u64, u64)>(layout(152, 8)), None);
    }
}
