//! [`StoreSizing`]: how much memory the spilling backend's embedded store
//! (fjall) may use, derived from the backend's budget of in-memory keys.
//!
//! This module owns the mapping from `memory_entries` to fjall's knobs and
//! the reasons for each number. It never opens a store.
//!
//! # Why the write buffer is small
//!
//! fjall counts a memtable entry as its key, its value and 9 bytes
//! (sequence number and type), about 20 bytes for a keyed count, but the
//! skip-list node, its tower and the two reference-counted byte slices
//! take several times that: with fjall's defaults (16 MiB memtables under
//! a 64 MiB write buffer) the memtables alone were about 200 MB at 2 M
//! keys whatever the key budget. Here the write buffer is three memtables
//! (the active one and two sealed ones being flushed), so writes stall
//! only when the flush worker falls behind by two memtables (fjall sleeps
//! 100 ms per write above 90 % of the write buffer, which is what halved
//! throughput when only the write buffer was shrunk).

/// One mebibyte.
const MIB: u64 = 1024 * 1024;

/// The bytes fjall counts for one memtable entry of a small state (key
/// group, a postcard key, a payload of a few bytes, 9 bytes of sequence
/// number and type): used to turn a memtable size into an entry count.
const COUNTED_BYTES_PER_ENTRY: u64 = 32;

/// The memtable, counted as fjall counts it, per budgeted key: at a budget
/// of 1 M keys a 1 MB memtable, i.e. about a thirtieth as many entries as
/// the hot table holds.
const MEMTABLE_BYTES_PER_KEY: u64 = 1;

/// The block cache per budgeted key (it holds decompressed 4 KiB blocks of
/// spilled entries read back).
const CACHE_BYTES_PER_KEY: u64 = 2;

/// The change log's entries per budgeted key: a snapshot interval may
/// write about as many entries as the records it processed (each miss
/// loads a key and evicts another) plus the write-back of the budget, so
/// a few budgets' worth lets a 1 s interval merge at a few hundred
/// thousand records per second and subtask (BENCHMARKS.md at 07a44e5).
const CHANGE_LOG_ENTRIES_PER_KEY: usize = 6;

/// The change log's least bound in entries, whatever the budget: the
/// entries a subtask writes to disk in one interval depend on its record
/// rate and miss rate, not on its budget (each miss loads a key and evicts
/// another), so a small budget under a high record rate overflowed a
/// bound of six entries per budgeted key every interval and fell back to
/// reading the whole disk table (at 100 k keys and a budget of 10 k, about
/// 180,000 writes per second and subtask against a bound of 60,000:
/// BENCHMARKS.md at 07a44e5). 2^18 entries cover a second and a half of that rate
/// without a compaction, for 8 MiB of records and 2 MiB of index per
/// instance; past it the log compacts (`changes.rs`).
const CHANGE_LOG_ENTRIES_FLOOR: usize = 1 << 18;

/// The change log's bytes per entry it may hold: an 8-byte header and the
/// key and payload of a small state (about 20 bytes for a keyed count).
const CHANGE_LOG_BYTES_PER_ENTRY: usize = 32;

/// The store's memory settings for one operator instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoreSizing {
    /// `Config::cache_size`: the keyspace's block cache.
    pub(crate) cache_bytes: u64,
    /// `PartitionCreateOptions::max_memtable_size`: the active memtable is
    /// sealed and flushed past this (counted as fjall counts entries).
    pub(crate) memtable_bytes: u32,
    /// `Config::max_write_buffer_size`: all memtables of the keyspace,
    /// active and sealed; writes stall above it.
    pub(crate) write_buffer_bytes: u64,
    /// `Config::max_journaling_size`: the journals on disk (not memory;
    /// fjall's minimum is 24 MiB, its default 512 MiB). fjall sleeps
    /// 500 ms per memtable rotation above 90 % of it, so it must leave
    /// room for the journals of sealed memtables not yet flushed and of
    /// journals its monitor has not yet deleted: at 32 MiB, writes stalled
    /// so often that throughput fell by 3 to 4 times (BENCHMARKS.md at 07a44e5).
    pub(crate) journal_bytes: u64,
    /// `PartitionCreateOptions::block_size`: the data and index blocks of
    /// the store's segments (uncompressed here). A point read of a key on
    /// disk decodes its whole block, so fjall's smallest, 1 KiB, not its
    /// default 4 KiB: it cut the CPU of a read-back workload by about 40 %
    /// for a few MB more of block index (BENCHMARKS.md at 07a44e5).
    pub(crate) block_bytes: u32,
    /// The leveled compaction's target segment size (on disk, compressed;
    /// fjall's default 64 MiB). A segment writer holds 16 bytes of bloom
    /// hashes per entry until the segment is finished, so this bounds that
    /// buffer too.
    pub(crate) segment_target_bytes: u32,
    /// At most this many entries go to disk in one eviction batch, so that
    /// one batch never overfills a memtable by more than about its size.
    pub(crate) eviction_batch_entries: usize,
    /// The change log's bound in entries ([`super::changes::ChangeLog`];
    /// it also keeps 8 bytes of index per entry, and 16 more while it is
    /// sorted).
    pub(crate) change_log_entries: usize,
    /// The change log's bound in bytes of records.
    pub(crate) change_log_bytes: usize,
}

impl StoreSizing {
    /// The settings for a backend keeping at most `memory_entries` keys in
    /// memory: each in-memory size grows with the budget between a floor
    /// (fjall's minimum write buffer is 1 MiB) and a ceiling that keeps
    /// the store to a few tens of MB per instance at any budget.
    pub(crate) fn for_budget(memory_entries: usize) -> Self {
        let keys = memory_entries.max(1) as u64;
        let memtable_bytes = keys
            .saturating_mul(MEMTABLE_BYTES_PER_KEY)
            .clamp(MIB / 2, 2 * MIB);
        let cache_bytes = keys.saturating_mul(CACHE_BYTES_PER_KEY).clamp(MIB, 4 * MIB);
        let batch = (memtable_bytes / COUNTED_BYTES_PER_ENTRY) as usize;
        StoreSizing {
            cache_bytes,
            // At most 2 MiB, so the cast cannot truncate.
            memtable_bytes: memtable_bytes as u32,
            write_buffer_bytes: (3 * memtable_bytes).max(MIB),
            journal_bytes: 128 * MIB,
            block_bytes: 1024,
            segment_target_bytes: 8 << 20,
            eviction_batch_entries: batch.min(memory_entries.max(4) / 4).max(1),
            change_log_entries: change_log_entries(memory_entries),
            change_log_bytes: change_log_entries(memory_entries)
                .saturating_mul(CHANGE_LOG_BYTES_PER_ENTRY),
        }
    }
}

/// The change log's bound in entries for a budget of `memory_entries`
/// keys: a few budgets' worth, and at least [`CHANGE_LOG_ENTRIES_FLOOR`].
fn change_log_entries(memory_entries: usize) -> usize {
    memory_entries
        .saturating_mul(CHANGE_LOG_ENTRIES_PER_KEY)
        .max(CHANGE_LOG_ENTRIES_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_stays_within_fjalls_limits_and_a_few_mb() {
        for budget in [0, 1, 10, 1_000, 100_000, 1_000_000, 100_000_000, usize::MAX] {
            let sizing = StoreSizing::for_budget(budget);
            // fjall panics below 1 MiB of write buffer and 24 MiB of journal.
            assert!(sizing.write_buffer_bytes >= MIB, "{budget}: {sizing:?}");
            assert!(sizing.journal_bytes >= 24 * MIB, "{budget}: {sizing:?}");
            // fjall panics outside 1 KiB to 512 KiB of block.
            assert!(
                (1024..=512 * 1024).contains(&sizing.block_bytes),
                "{budget}: {sizing:?}"
            );
            assert!(sizing.write_buffer_bytes <= 6 * MIB, "{budget}: {sizing:?}");
            assert!(sizing.cache_bytes <= 4 * MIB, "{budget}: {sizing:?}");
            // The write buffer holds the active memtable and two sealed ones.
            assert!(
                sizing.write_buffer_bytes >= 3 * u64::from(sizing.memtable_bytes),
                "{budget}: {sizing:?}"
            );
            assert!(sizing.eviction_batch_entries >= 1);
            assert!(
                u64::from(sizing.segment_target_bytes) <= 8 * MIB,
                "{budget}: {sizing:?}"
            );
            assert!(
                sizing.eviction_batch_entries as u64 * COUNTED_BYTES_PER_ENTRY
                    <= u64::from(sizing.memtable_bytes),
                "{budget}: {sizing:?}"
            );
        }
    }

    #[test]
    fn the_sizes_grow_with_the_budget_up_to_their_ceilings() {
        let small = StoreSizing::for_budget(10_000);
        let large = StoreSizing::for_budget(1_000_000);
        assert_eq!(small.memtable_bytes, 512 * 1024);
        assert_eq!(small.write_buffer_bytes, 3 * 512 * 1024);
        assert_eq!(small.cache_bytes, MIB);
        assert_eq!(large.memtable_bytes, 1_000_000);
        assert_eq!(large.write_buffer_bytes, 3_000_000);
        assert_eq!(large.cache_bytes, 2_000_000);
        assert_eq!(StoreSizing::for_budget(usize::MAX).memtable_bytes, 2 << 20);
        // The change log's bound: six entries per budgeted key, but never
        // below the floor that one interval of a small budget needs.
        assert_eq!(small.change_log_entries, CHANGE_LOG_ENTRIES_FLOOR);
        assert_eq!(large.change_log_entries, 6_000_000);
        assert_eq!(
            large.change_log_bytes,
            6_000_000 * CHANGE_LOG_BYTES_PER_ENTRY
        );
        // A batch is at most a quarter of the budget.
        assert_eq!(StoreSizing::for_budget(8).eviction_batch_entries, 2);
        assert_eq!(
            StoreSizing::for_budget(1_000_000).eviction_batch_entries,
            31_250
        );
    }
}
