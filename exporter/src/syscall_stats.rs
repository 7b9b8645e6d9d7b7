//! User space's side of the syscall statistics table: reading it, and freeing its slots.
//!
//! Maps: `SYSCALL_SLOTS` (hash, (cgroup, process, syscall) -> slot), `SYSCALL_STATS` (per-CPU
//! array of [`SlotStats`] indexed by slot), `FREE_SLOTS` (stack of unowned slots) and
//! `SLOT_EPOCH` (one `u64`). The probes (`ebpf/probes/src/syscalls.rs`) take a slot
//! for a new key from the stack and cache it per thread, so the hot path is an array lookup
//! instead of a hash lookup; user space is the only one that frees slots.
//!
//! Freeing a key's slot, after its final values were read: delete its `SYSCALL_SLOTS` entry,
//! zero every CPU's copy (owner included, so a thread still holding the slot in its cache
//! misses and looks the key up again), bump the epoch (every thread's cache is emptied on its
//! next call), and only then hand the slot back to the stack.

use std::os::fd::AsFd;

use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap, Map, MapData, MapError, PerCpuArray, PerCpuValues,
    Stack,
};
use sysscope_abi::{maps, SlotStats, SyscallKey, SyscallStats};

use crate::bpf_batch::{self, BatchError};

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("map `{map}`: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("no free slot in `SYSCALL_STATS` (the map is full)")]
    Full,
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> TableError {
    move |source| TableError::Map { map, source }
}

/// The four maps of the syscall statistics table.
pub struct SyscallStatsTable {
    slots: BpfHashMap<MapData, SyscallKey, u32>,
    stats: PerCpuArray<MapData, SlotStats>,
    free: Stack<MapData, u32>,
    epoch: Array<MapData, u64>,
    nr_cpus: usize,
    /// Whether the kernel supports batched lookups (cleared on the first refusal).
    batch: bool,
}

impl std::fmt::Debug for SyscallStatsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscallStatsTable")
            .field("nr_cpus", &self.nr_cpus)
            .finish_non_exhaustive()
    }
}

impl SyscallStatsTable {
    /// The table made of these maps (`SYSCALL_SLOTS`, `SYSCALL_STATS`, `FREE_SLOTS`,
    /// `SLOT_EPOCH`).
    pub fn new(slots: Map, stats: Map, free: Map, epoch: Map) -> Result<Self, TableError> {
        Ok(Self {
            slots: BpfHashMap::try_from(slots).map_err(map_err(maps::SYSCALL_SLOTS))?,
            stats: PerCpuArray::try_from(stats).map_err(map_err(maps::SYSCALL_STATS))?,
            free: Stack::try_from(free).map_err(map_err(maps::FREE_SLOTS))?,
            epoch: Array::try_from(epoch).map_err(map_err(maps::SLOT_EPOCH))?,
            nr_cpus: aya::util::nr_cpus().map(|n| n.max(1)).unwrap_or(1),
            batch: true,
        })
    }

    /// Every key with its slot.
    fn keys(&mut self) -> Vec<(SyscallKey, u32)> {
        if self.batch {
            match bpf_batch::lookup_all::<SyscallKey, u32>(self.slots.map().fd().as_fd()) {
                Ok(all) => return all,
                Err(BatchError::Unsupported) => self.batch = false,
                Err(e) => {
                    tracing::debug!(error = %e, "batched read failed; reading entry by entry")
                }
            }
        }
        self.slots.iter().filter_map(Result::ok).collect()
    }

    /// Every key's statistics, summed over the CPU copies that key owns. A key whose slot
    /// holds nothing yet (taken but not written) is left out.
    pub fn snapshot(&mut self) -> Vec<(SyscallKey, SyscallStats)> {
        let keys = self.keys();
        let Some(high) = keys.iter().map(|(_, slot)| *slot as usize + 1).max() else {
            return Vec::new();
        };
        // Slots in use are packed at the start (the free stack hands out the lowest first),
        // so one batched read of the prefix covers them.
        let mut copies: Vec<Option<Vec<SlotStats>>> = vec![None; high];
        let mut read = false;
        if self.batch {
            match bpf_batch::lookup_percpu_array_prefix::<SlotStats>(
                self.stats.map().fd().as_fd(),
                self.nr_cpus,
                high,
            ) {
                Ok(all) => {
                    for (slot, values) in all {
                        if let Some(c) = copies.get_mut(slot as usize) {
                            *c = Some(values);
                        }
                    }
                    read = true;
                }
                Err(BatchError::Unsupported) => self.batch = false,
                Err(e) => tracing::debug!(error = %e, "batched read failed; reading slot by slot"),
            }
        }
        if !read {
            for (_, slot) in &keys {
                if let Ok(values) = self.stats.get(slot, 0) {
                    copies[*slot as usize] = Some(values.iter().copied().collect());
                }
            }
        }
        keys.into_iter()
            .filter_map(|(key, slot)| {
                let values = copies.get(slot as usize)?.as_ref()?;
                sum_owned(&key, values)
            })
            .collect()
    }

    /// Frees the slots of `keys` (whose final values the caller has read). Keys without a
    /// slot are skipped.
    pub fn remove(&mut self, keys: &[SyscallKey]) {
        let mut freed = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(slot) = self.slots.get(key, 0) else {
                continue;
            };
            if self.slots.remove(key).is_err() {
                continue;
            }
            let zero = vec![SlotStats::default(); self.nr_cpus];
            if let Ok(zero) = PerCpuValues::try_from(zero) {
                let _ = self.stats.set(slot, zero, 0);
            }
            freed.push(slot);
        }
        if freed.is_empty() {
            return;
        }
        let epoch = self.epoch.get(&0, 0).unwrap_or(0);
        let _ = self.epoch.set(0, epoch.wrapping_add(1), 0);
        for slot in freed {
            if let Err(e) = self.free.push(slot, 0) {
                // Cannot happen (the stack holds every slot), but a lost slot only shrinks
                // the table: say so rather than fail.
                tracing::warn!(slot, error = %e, "could not return a slot to FREE_SLOTS");
            }
        }
    }

    /// Writes `per_cpu` as the statistics of `key`, taking a free slot if it has none (the
    /// scrape benchmark fills the table with synthetic entries this way).
    pub fn write(&mut self, key: &SyscallKey, per_cpu: &[SyscallStats]) -> Result<(), TableError> {
        let slot = match self.slots.get(key, 0) {
            Ok(slot) => slot,
            Err(_) => {
                let slot = self.free.pop(0).map_err(|_| TableError::Full)?;
                self.slots
                    .insert(key, slot, 0)
                    .map_err(map_err(maps::SYSCALL_SLOTS))?;
                slot
            }
        };
        let values: Vec<SlotStats> = (0..self.nr_cpus)
            .map(|cpu| SlotStats {
                key: *key,
                stats: per_cpu.get(cpu).copied().unwrap_or(SyscallStats::ZERO),
            })
            .collect();
        let values = PerCpuValues::try_from(values).map_err(|e| TableError::Map {
            map: maps::SYSCALL_STATS,
            source: MapError::SyscallError(aya::sys::SyscallError {
                call: "per-CPU values",
                io_error: e,
            }),
        })?;
        self.stats
            .set(slot, values, 0)
            .map_err(map_err(maps::SYSCALL_STATS))
    }
}

/// The sum of the copies `key` owns; `None` when it owns none.
fn sum_owned(key: &SyscallKey, copies: &[SlotStats]) -> Option<(SyscallKey, SyscallStats)> {
    let mut total = SyscallStats::ZERO;
    let mut owned = false;
    for copy in copies.iter().filter(|c| c.key == *key) {
        owned = true;
        total.sum_ns = total.sum_ns.wrapping_add(copy.stats.sum_ns);
        for (t, b) in total.buckets.iter_mut().zip(copy.stats.buckets.iter()) {
            *t = t.wrapping_add(*b);
        }
    }
    owned.then_some((*key, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, nr: u32) -> SyscallKey {
        SyscallKey {
            cgroup_id: 7,
            tgid,
            nr,
        }
    }

    fn copy(owner: SyscallKey, calls: u64) -> SlotStats {
        let mut stats = SyscallStats::ZERO;
        stats.buckets[3] = calls;
        stats.sum_ns = 100 * calls;
        SlotStats { key: owner, stats }
    }

    #[test]
    fn only_the_copies_a_key_owns_count() {
        let mine = key(10, 39);
        let previous_owner = key(11, 39);
        let copies = [copy(mine, 5), copy(previous_owner, 1000), copy(mine, 2)];
        let (_, total) = sum_owned(&mine, &copies).unwrap();
        assert_eq!(total.count(), 7);
        assert_eq!(total.sum_ns, 700);
        assert!(sum_owned(&key(12, 39), &copies).is_none());
    }
}
