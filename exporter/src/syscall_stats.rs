//! User space's side of the syscall statistics table: reading it, and freeing its slots.
//! (Read by the syscall collector and the command-line tools; why the table exists and why it
//! is safe: docs/performance.md, "The table of slots".)
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
    /// Keys that held a slot at the last snapshot.
    keys_held: usize,
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
            keys_held: 0,
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
    ///
    /// The array is read only where slots are held, in ranges (slots a few apart share one),
    /// and summed as it is read: a read never buffers more than one batch, however large the
    /// table or the node.
    pub fn snapshot(&mut self) -> Vec<(SyscallKey, SyscallStats)> {
        let mut keys = self.keys();
        self.keys_held = keys.len();
        keys.sort_unstable_by_key(|(_, slot)| *slot);
        let mut out = Vec::with_capacity(keys.len());
        let mut rest = keys.as_slice();
        while let Some(&(_, first)) = rest.first() {
            let run = rest
                .windows(2)
                .position(|w| w[1].1 - w[0].1 > RANGE_GAP)
                .map_or(rest.len(), |i| i + 1);
            let (held, after) = rest.split_at(run);
            rest = after;
            let last = held[held.len() - 1].1;
            if self.batch {
                let mut at = 0;
                let read = bpf_batch::for_each_percpu_array_range::<SlotStats>(
                    self.stats.map().fd().as_fd(),
                    self.nr_cpus,
                    first..last + 1,
                    |slot, copies| {
                        while at < held.len() && held[at].1 < slot {
                            at += 1;
                        }
                        // A slot is held by one key (two only while a probe and user space
                        // race on it): each counts the copies it owns.
                        for (key, _) in held[at..].iter().take_while(|(_, s)| *s == slot) {
                            out.extend(sum_owned(key, copies));
                        }
                    },
                );
                match read {
                    Ok(()) => continue,
                    Err(BatchError::Unsupported) => self.batch = false,
                    Err(e) => {
                        tracing::debug!(error = %e, "batched read failed; reading slot by slot");
                        // What the failed read handed over is dropped and read again below.
                        out.retain(|(key, _)| !held.iter().any(|(k, _)| k == key));
                    }
                }
            }
            for (key, slot) in held {
                if let Ok(copies) = self.stats.get(slot, 0) {
                    out.extend(sum_owned(key, &copies));
                }
            }
        }
        out
    }

    /// Keys holding a slot at the last [`snapshot`](Self::snapshot) (what fills the table).
    pub fn keys_held(&self) -> usize {
        self.keys_held
    }

    /// Frees the slots of `keys` (whose final values the caller has read). Keys without a
    /// slot are skipped.
    ///
    /// A slot goes back to `FREE_SLOTS` only once its copies are zeroed and the epoch is
    /// bumped: a slot whose copies still named its old key could be handed back to that same
    /// key (other threads of an exited leader still run) and its final values counted twice.
    /// A slot that cannot be cleaned is kept out of use instead (the table shrinks by one).
    pub fn remove(&mut self, keys: &[SyscallKey]) {
        let zero = || PerCpuValues::try_from(vec![SlotStats::default(); self.nr_cpus]);
        let mut freed = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(slot) = self.slots.get(key, 0) else {
                continue;
            };
            if self.slots.remove(key).is_err() {
                continue;
            }
            let zeroed = zero()
                .map_err(|e| {
                    MapError::SyscallError(aya::sys::SyscallError {
                        call: "per-CPU values",
                        io_error: e,
                    })
                })
                .and_then(|zero| self.stats.set(slot, zero, 0));
            match zeroed {
                Ok(()) => freed.push(slot),
                Err(e) => {
                    tracing::warn!(slot, error = %e, "could not zero a freed slot; keeping it out of use")
                }
            }
        }
        if freed.is_empty() {
            return;
        }
        let bumped = self
            .epoch
            .get(&0, 0)
            .and_then(|epoch| self.epoch.set(0, epoch.wrapping_add(1), 0));
        if let Err(e) = bumped {
            tracing::warn!(slots = freed.len(), error = %e, "could not bump SLOT_EPOCH; keeping the freed slots out of use");
            return;
        }
        for slot in freed {
            if let Err(e) = self.free.push(slot, 0) {
                // Cannot happen (the stack holds every slot), but a lost slot only shrinks
                // the table: say so rather than fail.
                tracing::warn!(slot, error = %e, "could not return a slot to FREE_SLOTS");
            }
        }
    }

    /// Writes `per_cpu` as the statistics of `key`, taking a free slot if it has none (the
    /// scrape benchmark fills the table with synthetic entries this way, beside the probes).
    pub fn write(&mut self, key: &SyscallKey, per_cpu: &[SyscallStats]) -> Result<(), TableError> {
        let slot = match self.slots.get(key, 0) {
            Ok(slot) => slot,
            Err(_) => {
                let slot = self.free.pop(0).map_err(|_| TableError::Full)?;
                // BPF_NOEXIST, as the probes do: if a probe gave the key a slot meanwhile, that
                // slot stays the key's and ours goes back.
                match self.slots.insert(key, slot, BPF_NOEXIST) {
                    Ok(()) => slot,
                    Err(e) => {
                        let _ = self.free.push(slot, 0);
                        self.slots
                            .get(key, 0)
                            .map_err(|_| map_err(maps::SYSCALL_SLOTS)(e))?
                    }
                }
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

/// Held slots at most this far apart are read in one range (reading a few free slots costs
/// less than another `bpf()` call).
const RANGE_GAP: u32 = 64;

/// `BPF_NOEXIST`: create only.
const BPF_NOEXIST: u64 = 1;

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

    /// Creates a map (type, key size, value size, max entries) as an aya `Map`.
    fn create(map_type: u32, key_size: u32, value_size: u32, entries: u32) -> Map {
        use std::os::fd::{FromRawFd, OwnedFd};
        let mut attr = [0u8; 128];
        for (i, v) in [map_type, key_size, value_size, entries].iter().enumerate() {
            attr[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        // SAFETY: a zero-padded bpf_attr for BPF_MAP_CREATE of the size passed.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, 0, attr.as_mut_ptr(), attr.len()) };
        assert!(fd >= 0, "map create: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Map::from_map_data(MapData::from_fd(fd).expect("map info")).expect("a known map type")
    }

    fn root(test: &str) -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true" && v != "1"),
            "{test} needs root, and CI must run it"
        );
        eprintln!("SKIPPED {test}: needs root");
        false
    }

    fn stats(calls: u64) -> SyscallStats {
        let mut s = SyscallStats::ZERO;
        s.buckets[2] = calls;
        s.sum_ns = 3000 * calls;
        s
    }

    /// The table over real kernel maps: keys at slots far apart (several read ranges), a copy
    /// left by a previous owner, frees that leave nothing behind, and a freed slot handed to a
    /// new key that must start from zero.
    #[test]
    fn sparse_slots_are_read_exactly_and_freed_clean() {
        if !root("sparse_slots_are_read_exactly_and_freed_clean") {
            return;
        }
        let nr_cpus = aya::util::nr_cpus().unwrap().max(1);
        let capacity = 1000;
        let mut table = SyscallStatsTable::new(
            create(1 /* HASH */, 16, 4, capacity),
            create(
                6, /* PERCPU_ARRAY */
                4,
                std::mem::size_of::<SlotStats>() as u32,
                capacity,
            ),
            create(23 /* STACK */, 0, 4, capacity),
            create(2 /* ARRAY */, 4, 8, 1),
        )
        .unwrap();
        // Popped in this order: 5, 6, 300, 301, 999 (three read ranges).
        for slot in [999, 301, 300, 6, 5] {
            table.free.push(slot, 0).unwrap();
        }
        let keys: Vec<SyscallKey> = (0..5).map(|i| key(100 + i, 39)).collect();
        for (i, k) in keys.iter().enumerate() {
            // Calls on the first CPU and the last.
            let mut per_cpu = vec![SyscallStats::ZERO; nr_cpus];
            per_cpu[0] = stats(i as u64 + 1);
            per_cpu[nr_cpus - 1].sum_ns += 7;
            table.write(k, &per_cpu).unwrap();
        }
        assert_eq!(table.slots.get(&keys[4], 0).unwrap(), 999);
        // Slot 6 (keys[1]) on the last CPU still holds a previous owner's copy: not keys[1]'s.
        let mut copies: Vec<SlotStats> = table.stats.get(&6, 0).unwrap().iter().copied().collect();
        copies[nr_cpus - 1] = copy(key(1, 39), 1000);
        table
            .stats
            .set(6, PerCpuValues::try_from(copies).unwrap(), 0)
            .unwrap();
        let mut read = table.snapshot();
        read.sort_unstable_by_key(|(k, _)| k.tgid);
        assert_eq!(table.keys_held(), 5);
        // Every key: its calls plus the 7 ns on the last CPU, except keys[1], whose last-CPU
        // copy is the stray one (with one CPU, keys[1] owns no copy at all).
        let want: Vec<(SyscallKey, SyscallStats)> = keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let mut s = stats(i as u64 + 1);
                s.sum_ns += 7;
                if i == 1 {
                    if nr_cpus == 1 {
                        return None;
                    }
                    s.sum_ns -= 7;
                }
                Some((*k, s))
            })
            .collect();
        assert_eq!(read, want);

        // Free slots 6 and 300: keys gone, copies zeroed, epoch bumped, slots free again.
        table.remove(&[keys[1], keys[2], key(77, 1) /* holds no slot */]);
        assert!(table.slots.get(&keys[1], 0).is_err());
        assert!(table.slots.get(&keys[2], 0).is_err());
        for slot in [6, 300] {
            let copies = table.stats.get(&slot, 0).unwrap();
            assert!(
                copies.iter().all(|c| *c == SlotStats::default()),
                "slot {slot}"
            );
        }
        assert_eq!(table.epoch.get(&0, 0).unwrap(), 1);
        let mut read = table.snapshot();
        read.sort_unstable_by_key(|(k, _)| k.tgid);
        assert_eq!(
            read.iter().map(|(k, _)| k.tgid).collect::<Vec<_>>(),
            [100, 103, 104]
        );

        // The last slot freed is handed out first; the new key sees only its own calls.
        let newcomer = key(200, 0);
        table.write(&newcomer, &[stats(4)]).unwrap();
        assert_eq!(table.slots.get(&newcomer, 0).unwrap(), 300);
        let read = table.snapshot();
        let (_, got) = read.iter().find(|(k, _)| *k == newcomer).unwrap();
        assert_eq!(*got, stats(4));
        assert_eq!(table.keys_held(), 4);
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
