//! User space's side of the syscall statistics table: reading it, and freeing its slots.
//! (Read by the syscall collector and the command-line tools; why the table exists and why it
//! is safe: docs/performance.md, "The table of slots".)
//!
//! Maps: `SYSCALL_SLOTS` (hash, (cgroup, process, syscall) -> slot), `SYSCALL_STATS` (array of
//! [`SlotStats`], a few copies per slot chosen by CPU, so its size does not grow with the CPU
//! count), `SYSCALL_STATES` (array of [`StateStats`], one beside each copy: the time
//! switched-out calls spent off CPU, by part), `FREE_SLOTS` (stack of unowned slots),
//! `SLOT_EPOCH` (one `u64`), and the counts `CGROUP_TAKEN` (written by the probes) and
//! `CGROUP_RETURNED` (written here) of the slots each cgroup's processes hold, the slots all
//! processes hold, and (for `SYSCALL_ERRORS`, whose deletes [`SyscallMaps::remove_errors`]
//! counts) the error keys each cgroup's processes and all processes hold: the bounds that keep
//! a reserve of each map for the cgroups' shared keys (keys: [`quota_key`]).
//!
//! The parts off CPU are read after the durations ([`SyscallStatsTable::state_snapshot`] after
//! [`SyscallStatsTable::snapshot`]), and the probes add a call's parts before its duration: a
//! read never holds a duration without its parts, so the on-CPU time derived from the two
//! (duration less the parts) is never ahead of the truth, and is exact once the calls read
//! have all been added. The probes (`ebpf/probes/src/syscalls.rs`) take a slot for a new key from
//! the stack and cache it per thread, so the hot path is an array lookup instead of a hash
//! lookup; user space is the only one that frees slots.
//!
//! Freeing a key's slot, after its final values were read: delete its `SYSCALL_SLOTS` entry,
//! zero every copy (owner included, so a thread still holding the slot in its cache misses and
//! looks the key up again), bump the epoch (every thread's cache is emptied on its next call),
//! and only then hand the slot back to the stack and count it returned to its cgroup.

use std::{collections::HashMap, ops::Range, os::fd::AsFd};

use aya::maps::{
    Array, HashMap as BpfHashMap, IterableMap, Map, MapData, MapError, RingBuf, Stack,
};
use sysscope_abi::{
    maps, programs, quota_key, ErrnoKey, OffCpuEvent, ProcessExit, SlotStats, StateStats,
    SyscallKey, SyscallStats, FOLDED_TGID,
};

use crate::{
    config::Config,
    kernel::bpf_batch::{self, BatchError},
    kernel::cumulative::{deleted, Counters, HashReader, Snapshot},
    kernel::ring,
    kernel::{read_err, ProbeError, Probes},
    util::error::Chain,
};

/// This family's map sizes for `config`, which the loader applies: the statistics table with
/// `stripes` copies per slot (and the parts off CPU beside each copy, when calls' time is split
/// by state; one unused entry otherwise), its free-slot stack and per-cgroup counts, errors and
/// exits.
pub(crate) fn map_sizes(config: &Config, stripes: u32) -> [(&'static str, u32); 8] {
    let limits = &config.limits;
    let slots = limits.max_syscall_entries;
    // One count per cgroup holding slots and one per cgroup holding error keys (at most one
    // per entry, and far fewer in practice), and the two counts of all processes.
    let quota_entries = (slots / 4 + limits.max_error_entries / 4).max(64) + 2;
    let state_copies = if config.syscalls.time_by_state {
        slots.saturating_mul(stripes)
    } else {
        1
    };
    [
        (maps::SYSCALL_STATS, slots.saturating_mul(stripes)),
        (maps::SYSCALL_STATES, state_copies),
        (maps::SYSCALL_SLOTS, slots),
        (maps::FREE_SLOTS, slots),
        (maps::CGROUP_TAKEN, quota_entries),
        (maps::CGROUP_RETURNED, quota_entries),
        (maps::SYSCALL_ERRORS, limits.max_error_entries),
        (maps::PROCESS_EXITS, limits.max_exited_processes),
    ]
}

/// The syscall probes' maps, with the probes attached: what the collector reads, and what the
/// command-line tools (`sysscope summary`, `top`, ...) read with their own filters.
pub(crate) struct SyscallMaps {
    pub(crate) stats: SyscallStatsTable,
    pub(crate) errors: HashReader<ErrnoKey, u64>,
    pub(crate) exits: ExitQueue,
}

impl SyscallMaps {
    /// Takes the maps and attaches `sched_process_exit`, `cgroup_attach_task`, `sched_wakeup`
    /// (when calls' time is split by state), `sched_switch`, `sys_exit` and `sys_enter`, in that
    /// order, recording them under `collector`.
    pub(crate) fn attach(probes: &mut Probes, collector: &'static str) -> Result<Self, ProbeError> {
        let map_err = |name: &'static str| {
            move |source| ProbeError::Map {
                map: name.into(),
                source,
            }
        };
        let stats = SyscallStatsTable::new(TableMaps {
            slots: probes.take_map(maps::SYSCALL_SLOTS)?,
            stats: probes.take_map(maps::SYSCALL_STATS)?,
            free: probes.take_map(maps::FREE_SLOTS)?,
            epoch: probes.take_map(maps::SLOT_EPOCH)?,
            taken: probes.take_map(maps::CGROUP_TAKEN)?,
            returned: probes.take_map(maps::CGROUP_RETURNED)?,
            states: probes.take_map(maps::SYSCALL_STATES)?,
        })
        .map_err(|e| ProbeError::StatsTable(Box::new(e)))?;
        let errors = HashReader::new(
            BpfHashMap::try_from(probes.take_map(maps::SYSCALL_ERRORS)?)
                .map_err(map_err(maps::SYSCALL_ERRORS))?,
        );
        let exits = BpfHashMap::try_from(probes.take_map(maps::PROCESS_EXITS)?)
            .map(ExitQueue)
            .map_err(map_err(maps::PROCESS_EXITS))?;
        // Exit tracking first, so no process can exit unseen once syscalls are counted.
        probes.attach_raw_tracepoint(collector, programs::PROCESS_EXIT, "sched_process_exit")?;
        probes.attach_raw_tracepoint(collector, programs::CGROUP_ATTACH, "cgroup_attach_task")?;
        // Before the syscall programs: a program exec'd into the other ABI is read again.
        probes.attach_raw_tracepoint(collector, programs::PROCESS_EXEC, "sched_process_exec")?;
        // Wakeups before switches: a task switched out blocked once these run is seen woken.
        // (A call already blocked when they attach ends with its time off CPU unknown.)
        if probes.time_by_state() {
            probes.attach_raw_tracepoint(collector, programs::SCHED_WAKEUP, "sched_wakeup")?;
        }
        // Before the syscall programs: no entry may stay on a CPU its task has left.
        probes.attach_raw_tracepoint(collector, programs::SCHED_SWITCH, "sched_switch")?;
        probes.attach_raw_tracepoint(collector, programs::SYS_EXIT, "sys_exit")?;
        probes.attach_raw_tracepoint(collector, programs::SYS_ENTER, "sys_enter")?;
        Ok(Self {
            stats,
            errors,
            exits,
        })
    }

    /// Deletes the error entries of `keys` (whose final values the caller has read), counts
    /// those of processes returned to their cgroup's and to all processes' error bounds, and
    /// returns the keys that are gone from the kernel (see [`HashReader::remove`]).
    pub(crate) fn remove_errors(&mut self, keys: &[ErrnoKey]) -> Vec<ErrnoKey> {
        let gone = self.errors.remove(keys);
        let mut returned: HashMap<u64, u64> = HashMap::new();
        for key in gone.iter().filter(|k| k.tgid != FOLDED_TGID) {
            *returned
                .entry(quota_key::errors_of(key.cgroup_id))
                .or_default() += 1;
            *returned.entry(quota_key::ALL_ERRORS).or_default() += 1;
        }
        self.stats.count_returned(returned);
        gone
    }
}

/// `OFFCPU_EVENTS`: every stretch a counted call spent off its CPU, as the scheduler programs
/// stamped it (only when the probes were loaded with
/// [`LoadOptions::state_trace_ring_buffer_bytes`](crate::kernel::LoadOptions), i.e. by
/// `sysscope trace`, whose syscall programs count only its target).
pub(crate) struct OffCpuEvents(RingBuf<MapData>);

impl OffCpuEvents {
    /// Takes the ring buffer (the programs are attached with [`SyscallMaps::attach`]).
    pub(crate) fn take(probes: &mut Probes) -> Result<Self, ProbeError> {
        RingBuf::try_from(probes.take_map(maps::OFFCPU_EVENTS)?)
            .map(Self)
            .map_err(read_err(maps::OFFCPU_EVENTS))
    }

    /// Hands every record waiting to `each`; returns how many.
    pub(crate) fn drain(&mut self, each: impl FnMut(&OffCpuEvent)) -> u64 {
        ring::drain(&mut self.0, each)
    }
}

/// `PROCESS_EXITS`: the processes whose leader exited, queued by `sched_process_exit` with the
/// name they had. The process's entries are read once more after its record is seen, then
/// reclaimed, and only then is the record dropped: the one exit lifecycle of the syscall
/// statistics, for the collector and the command-line tools alike.
pub(crate) struct ExitQueue(BpfHashMap<MapData, u32, ProcessExit>);

impl ExitQueue {
    /// The records queued, as (tgid, record); a record that cannot be read is left for the
    /// next read.
    pub(crate) fn read(&self) -> Vec<(u32, ProcessExit)> {
        self.0.iter().flatten().collect()
    }

    /// Drops the records of processes whose entries were read for the last time.
    pub(crate) fn forget<'a>(&mut self, tgids: impl IntoIterator<Item = &'a u32>) {
        for tgid in tgids {
            // Already gone is fine: nothing else removes records, and a failed remove leaves
            // the record for the next read, which finds the process's entries gone.
            let _ = self.0.remove(tgid);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("map `{map}`")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("no free slot in `SYSCALL_STATS` (the map is full)")]
    Full,
    #[error("`SYSCALL_STATS` holds {entries} copies, not a whole number per slot of {slots}")]
    Layout { entries: u32, slots: u32 },
    #[error("reading the maps process {pid} holds ({path})")]
    Held {
        pid: u32,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("process {pid} holds no `{map}` map")]
    NotHeld { pid: u32, map: &'static str },
}

fn map_err(map: &'static str) -> impl Fn(MapError) -> TableError {
    move |source| TableError::Map { map, source }
}

/// The maps of the syscall statistics table.
pub struct SyscallStatsTable {
    slots: BpfHashMap<MapData, SyscallKey, u32>,
    stats: Array<MapData, SlotStats>,
    free: Stack<MapData, u32>,
    epoch: Array<MapData, u64>,
    taken: BpfHashMap<MapData, u64, u64>,
    returned: BpfHashMap<MapData, u64, u64>,
    /// `SYSCALL_STATES`. Held even when it is not read: `sys_exit` names it, and a map whose
    /// last descriptor is closed before the programs that name it are loaded makes their
    /// load fail ("fd N is not pointing to valid bpf_map").
    states: Array<MapData, StateStats>,
    /// Whether `states` has a value beside every copy (calls' time is split by state).
    splits: bool,
    /// Copies per slot (`SYSCALL_STAT_STRIPES`, as the loader chose it).
    stripes: u32,
    /// Whether the kernel supports batched lookups (cleared on the first refusal).
    batch: bool,
    /// Keys that held a slot at the last snapshot.
    keys_held: usize,
    /// What the last snapshot read: each key with its slot and the copies that named it (bit
    /// `stripe`), for the parts off CPU read after it; and whether it was complete.
    last_read: (Vec<(SyscallKey, u32, u8)>, bool),
    /// What the last snapshot read of each cgroup's shared key: [`Self::remove`] frees such a
    /// key's slot only while it still holds exactly that (see there).
    folded_read: HashMap<SyscallKey, SyscallStats>,
}

impl std::fmt::Debug for SyscallStatsTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyscallStatsTable")
            .field("stripes", &self.stripes)
            .finish_non_exhaustive()
    }
}

/// The maps a [`SyscallStatsTable`] is made of, as taken from the loaded object.
pub(crate) struct TableMaps {
    pub(crate) slots: Map,
    pub(crate) stats: Map,
    pub(crate) free: Map,
    pub(crate) epoch: Map,
    pub(crate) taken: Map,
    pub(crate) returned: Map,
    pub(crate) states: Map,
}

impl TableMaps {
    /// The table's maps that another process (a running exporter) holds open, found by name
    /// among the maps in its fdinfo and opened by id (needs CAP_SYS_ADMIN).
    fn held_by(pid: u32) -> Result<Self, TableError> {
        let path = format!("/proc/{pid}/fdinfo");
        let held: Vec<(u32, String)> = crate::util::fdinfo::read(&path)
            .map_err(|source| TableError::Held {
                pid,
                path: path.clone(),
                source,
            })?
            .iter()
            .filter_map(|info| info.field("map_id:"))
            .filter_map(|id| {
                let name = aya::maps::MapInfo::from_id(id as u32).ok()?;
                Some((id as u32, name.name_as_str()?.to_string()))
            })
            .collect();
        let open = |map: &'static str| -> Result<Map, TableError> {
            let (id, _) = held
                .iter()
                .find(|(_, name)| name == map)
                .ok_or(TableError::NotHeld { pid, map })?;
            MapData::from_id(*id)
                .and_then(Map::from_map_data)
                .map_err(map_err(map))
        };
        Ok(Self {
            slots: open(maps::SYSCALL_SLOTS)?,
            stats: open(maps::SYSCALL_STATS)?,
            free: open(maps::FREE_SLOTS)?,
            epoch: open(maps::SLOT_EPOCH)?,
            taken: open(maps::CGROUP_TAKEN)?,
            returned: open(maps::CGROUP_RETURNED)?,
            states: open(maps::SYSCALL_STATES)?,
        })
    }
}

impl SyscallStatsTable {
    /// The table of running exporter `pid`, opened from the maps it holds (the scrape
    /// benchmark fills it with synthetic entries this way; needs CAP_SYS_ADMIN).
    pub fn of_process(pid: u32) -> Result<Self, TableError> {
        Self::new(TableMaps::held_by(pid)?)
    }

    /// The table made of these maps. The copies per slot are read off the maps' sizes, so they
    /// always match what the loader chose.
    pub(crate) fn new(maps: TableMaps) -> Result<Self, TableError> {
        let slots: BpfHashMap<MapData, SyscallKey, u32> =
            BpfHashMap::try_from(maps.slots).map_err(map_err(maps::SYSCALL_SLOTS))?;
        let stats: Array<MapData, SlotStats> =
            Array::try_from(maps.stats).map_err(map_err(maps::SYSCALL_STATS))?;
        let slot_count = slots
            .map()
            .info()
            .map_err(map_err(maps::SYSCALL_SLOTS))?
            .max_entries();
        let entries = stats.len();
        if slot_count == 0 || !entries.is_multiple_of(slot_count) {
            return Err(TableError::Layout {
                entries,
                slots: slot_count,
            });
        }
        let states: Array<MapData, StateStats> =
            Array::try_from(maps.states).map_err(map_err(maps::SYSCALL_STATES))?;
        let splits = states.len() == entries;
        Ok(Self {
            slots,
            stats,
            states,
            splits,
            free: Stack::try_from(maps.free).map_err(map_err(maps::FREE_SLOTS))?,
            epoch: Array::try_from(maps.epoch).map_err(map_err(maps::SLOT_EPOCH))?,
            taken: BpfHashMap::try_from(maps.taken).map_err(map_err(maps::CGROUP_TAKEN))?,
            returned: BpfHashMap::try_from(maps.returned)
                .map_err(map_err(maps::CGROUP_RETURNED))?,
            stripes: entries / slot_count,
            batch: true,
            keys_held: 0,
            last_read: (Vec::new(), false),
            folded_read: HashMap::new(),
        })
    }

    /// Whether the table keeps calls' time off CPU ([`Self::state_snapshot`]).
    pub fn splits_by_state(&self) -> bool {
        self.splits
    }

    /// Copies per slot.
    #[cfg(test)]
    pub(crate) fn stripes(&self) -> u32 {
        self.stripes
    }

    /// Every key with its slot, and whether the walk reached them all.
    fn keys(&mut self) -> (Vec<(SyscallKey, u32)>, bool) {
        if self.batch {
            match bpf_batch::lookup_all::<SyscallKey, u32>(self.slots.map().fd().as_fd()) {
                Ok(all) => return (all, true),
                Err(BatchError::Unsupported) => self.batch = false,
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "batched read failed; reading entry by entry")
                }
            }
        }
        let mut keys = Vec::new();
        for item in self.slots.iter() {
            match item {
                Ok(entry) => keys.push(entry),
                Err(_) => return (keys, false),
            }
        }
        (keys, true)
    }

    /// Every key's statistics, summed over the copies of its slot that name it. A key whose
    /// slot holds nothing yet is left out, and so is a key whose copies could not all be read
    /// (a partial sum would look like a re-created entry): the snapshot is then incomplete.
    ///
    /// The array is read only where slots are held, in ranges (slots a few apart share one),
    /// and summed as it is read: a read never buffers more than one batch. What a read costs
    /// depends on the keys held, never on the node's CPU count.
    pub fn snapshot(&mut self) -> Snapshot<SyscallKey, SyscallStats> {
        let (mut keys, mut complete) = self.keys();
        self.keys_held = keys.len();
        keys.sort_unstable_by_key(|(_, slot)| *slot);
        let stripes = self.stripes;
        // Per key (in `keys` order): its sum, and the copies that named it (bit `stripe`).
        let mut sums = vec![(SyscallStats::ZERO, 0u8); keys.len()];
        for (held, indices) in slot_runs(&keys, |k| k.1, stripes) {
            if self.batch {
                let read = bpf_batch::for_each_array_range::<SlotStats>(
                    self.stats.map().fd().as_fd(),
                    indices.clone(),
                    |index, copy| {
                        add_copy(
                            &keys[held.clone()],
                            &mut sums[held.clone()],
                            (index / stripes, index % stripes),
                            copy,
                        )
                    },
                );
                match read {
                    Ok(()) => continue,
                    Err(BatchError::Unsupported) => self.batch = false,
                    Err(e) => {
                        tracing::debug!(error = %Chain(&e), "batched read failed; reading copy by copy");
                    }
                }
                // What the failed read handed over is dropped and read again below.
                for sum in &mut sums[held.clone()] {
                    *sum = (SyscallStats::ZERO, 0);
                }
            }
            let mut read_all = true;
            for index in indices {
                match self.stats.get(&index, 0) {
                    Ok(copy) => add_copy(
                        &keys[held.clone()],
                        &mut sums[held.clone()],
                        (index / stripes, index % stripes),
                        &copy,
                    ),
                    Err(_) => read_all = false,
                }
            }
            if !read_all {
                complete = false;
                for sum in &mut sums[held.clone()] {
                    *sum = (SyscallStats::ZERO, 0);
                }
            }
        }
        // What state_snapshot reads the parts of: kept only where the split is loaded.
        let keep = self.splits;
        let mut read = Vec::with_capacity(if keep { keys.len() } else { 0 });
        let folded_read = &mut self.folded_read;
        folded_read.clear();
        let entries = keys
            .into_iter()
            .zip(sums)
            .filter(|(_, (_, owned))| *owned != 0)
            .map(|((key, slot), (stats, owned))| {
                if keep {
                    read.push((key, slot, owned));
                }
                if key.tgid == FOLDED_TGID {
                    folded_read.insert(key, stats);
                }
                (key, stats)
            })
            .collect();
        self.last_read = (read, complete);
        Snapshot::ended(entries, complete)
    }

    /// The parts off CPU of the keys the last [`snapshot`](Self::snapshot) read, summed over
    /// the same copies (those that named the key then). Read after the snapshot, so it holds
    /// the parts of every call whose duration the snapshot holds (and perhaps of a few calls
    /// counted since). Empty when the table does not split calls' time by state.
    pub fn state_snapshot(&mut self) -> Snapshot<SyscallKey, StateStats> {
        let (keys, mut complete) = std::mem::take(&mut self.last_read);
        if !self.splits {
            return Snapshot::ended(Vec::new(), complete);
        }
        let states = &self.states;
        let stripes = self.stripes;
        let mut sums = vec![StateStats::ZERO; keys.len()];
        for (held, indices) in slot_runs(&keys, |k| k.1, stripes) {
            let add = |sums: &mut [StateStats], index: u32, copy: &StateStats| {
                let (slot, stripe) = (index / stripes, index % stripes);
                let first = keys[held.clone()].partition_point(|(_, s, _)| *s < slot);
                for (i, (_, _, owned)) in keys[held.start + first..held.end]
                    .iter()
                    .enumerate()
                    .take_while(|(_, (_, s, _))| *s == slot)
                {
                    if owned & (1 << stripe) != 0 {
                        sums[first + i].add(copy);
                    }
                }
            };
            let mut read_all = false;
            if self.batch {
                let read = bpf_batch::for_each_array_range::<StateStats>(
                    states.map().fd().as_fd(),
                    indices.clone(),
                    |index, copy| add(&mut sums[held.clone()], index, copy),
                );
                match read {
                    Ok(()) => read_all = true,
                    Err(BatchError::Unsupported) => self.batch = false,
                    Err(e) => {
                        tracing::debug!(error = %Chain(&e), "batched read failed; reading copy by copy");
                    }
                }
                if !read_all {
                    sums[held.clone()].fill(StateStats::ZERO);
                }
            }
            if !read_all {
                read_all = true;
                for index in indices {
                    match states.get(&index, 0) {
                        Ok(copy) => add(&mut sums[held.clone()], index, &copy),
                        Err(_) => read_all = false,
                    }
                }
            }
            if !read_all {
                complete = false;
                sums[held.clone()].fill(StateStats::ZERO);
            }
        }
        let entries = keys.into_iter().map(|(key, _, _)| key).zip(sums).collect();
        Snapshot::ended(entries, complete)
    }

    /// Keys holding a slot at the last [`snapshot`](Self::snapshot) (what fills the table).
    pub(crate) fn keys_held(&self) -> usize {
        self.keys_held
    }

    /// Frees the slots of `keys` (whose final values the caller has read) and returns the keys
    /// that are gone from the kernel: those whose entry was deleted, and those that held none.
    /// A key whose delete failed is not returned: its values are still there, and forgetting
    /// what was read of them would count them twice.
    ///
    /// A slot goes back to `FREE_SLOTS` only once its copies are zeroed and the epoch is
    /// bumped: a slot whose copies still named its old key could be handed back to that same
    /// key (other threads of an exited leader still run) and its final values counted twice.
    /// A slot that cannot be cleaned is kept out of use instead (the table shrinks by one).
    pub(crate) fn remove(&mut self, keys: &[SyscallKey]) -> Vec<SyscallKey> {
        let mut gone = Vec::with_capacity(keys.len());
        let mut freed = Vec::with_capacity(keys.len());
        for key in keys {
            let Ok(slot) = self.slots.get(key, 0) else {
                gone.push(*key);
                continue;
            };
            if key.tgid == FOLDED_TGID {
                if !self.free_folded(key, slot) {
                    continue;
                }
            } else if !deleted(self.slots.remove(key)) {
                continue;
            }
            gone.push(*key);
            let zeroed = (0..self.stripes).try_for_each(|stripe| {
                let index = slot * self.stripes + stripe;
                self.stats.set(index, SlotStats::default(), 0)?;
                if self.splits {
                    self.states.set(index, StateStats::ZERO, 0)
                } else {
                    Ok(())
                }
            });
            match zeroed {
                Ok(()) => freed.push((slot, *key)),
                Err(e) => {
                    tracing::warn!(slot, error = %Chain(&e), "could not zero a freed slot; keeping it out of use")
                }
            }
        }
        if freed.is_empty() {
            return gone;
        }
        let bumped = self
            .epoch
            .get(&0, 0)
            .and_then(|epoch| self.epoch.set(0, epoch.wrapping_add(1), 0));
        if let Err(e) = bumped {
            tracing::warn!(slots = freed.len(), error = %Chain(&e), "could not bump SLOT_EPOCH; keeping the freed slots out of use");
            return gone;
        }
        let mut returned: HashMap<u64, u64> = HashMap::new();
        for (slot, key) in freed {
            if let Err(e) = self.free.push(slot, 0) {
                // Cannot happen (the stack holds every slot), but a lost slot only shrinks
                // the table: say so rather than fail.
                tracing::warn!(slot, error = %Chain(&e), "could not return a slot to FREE_SLOTS");
            }
            // Shared keys hold slots outside the quota and the processes' share.
            if key.tgid != FOLDED_TGID {
                *returned.entry(key.cgroup_id).or_default() += 1;
                *returned.entry(quota_key::ALL_SLOTS).or_default() += 1;
            }
        }
        self.count_returned(returned);
        gone
    }

    /// Deletes the `SYSCALL_SLOTS` entry of a cgroup's shared key, which holds `slot`, if the
    /// key is still idle; whether it did. Unlike a process's key, which is freed after its
    /// process exited, a shared key is freed while its cgroup lives: its processes may count
    /// in it again at any time, and a call counted after the read that found the key idle
    /// would be wiped with the slot, lost without a trace. So the slot is freed only if its
    /// copies still hold what that read saw, both before the delete and after it; a call
    /// counted meanwhile puts the entry back. (Only if a probe gave the key a new slot within
    /// the few microseconds between the delete and the check after it are the calls counted
    /// there meanwhile lost, as in the window every freed slot has: docs/performance.md.)
    fn free_folded(&mut self, key: &SyscallKey, slot: u32) -> bool {
        let Some(read) = self.folded_read.get(key).copied() else {
            // Not read by the last snapshot: nothing says it is idle.
            return false;
        };
        if self.slot_sum(key, slot) != Some(read) {
            return false;
        }
        if !deleted(self.slots.remove(key)) {
            return false;
        }
        let after = self.slot_sum(key, slot);
        if after == Some(read) {
            return true;
        }
        // A call landed between the check and the delete (its probe found the entry, or the
        // slot in its thread's cache): the key keeps its slot.
        match self.slots.insert(key, slot, BPF_NOEXIST) {
            Ok(()) => false,
            Err(e) => {
                tracing::debug!(slot, error = %Chain(&e), "a shared key took a new slot while its old one was freed");
                true
            }
        }
    }

    /// The statistics of `key` in the copies of `slot` that name it; `None` if a copy cannot
    /// be read.
    fn slot_sum(&self, key: &SyscallKey, slot: u32) -> Option<SyscallStats> {
        let mut sum = SyscallStats::ZERO;
        for stripe in 0..self.stripes {
            let copy = self.stats.get(&(slot * self.stripes + stripe), 0).ok()?;
            if copy.key == *key {
                sum.add(&copy.stats);
            }
        }
        Some(sum)
    }

    /// Adds entries returned to the counts of `CGROUP_RETURNED` (keys of [`quota_key`]).
    fn count_returned(&mut self, returned: HashMap<u64, u64>) {
        for (count, n) in returned {
            let before = self.returned.get(&count, 0).unwrap_or(0);
            if let Err(e) = self.returned.insert(count, before + n, 0) {
                // The count then looks fuller than it is: new keys fold sooner.
                tracing::debug!(error = %Chain(&e), "could not count entries returned to a bound");
            }
        }
    }

    /// Forgets the slot counts of cgroups that hold no slot (most are cgroups that are gone),
    /// so the count maps do not fill with dead cgroups. The probes' count goes first: a slot
    /// taken meanwhile is then counted from zero again, never against an old return.
    pub(crate) fn forget_idle_cgroups(&mut self) {
        let taken: Vec<(u64, u64)> = if self.batch {
            bpf_batch::lookup_all::<u64, u64>(self.taken.map().fd().as_fd()).unwrap_or_default()
        } else {
            self.taken.iter().filter_map(Result::ok).collect()
        };
        for (cgroup_id, taken) in taken {
            let returned = self.returned.get(&cgroup_id, 0).unwrap_or(0);
            if taken <= returned && self.taken.remove(&cgroup_id).is_ok() {
                let _ = self.returned.remove(&cgroup_id);
            }
        }
    }

    /// Slots the keys of `cgroup_id` hold, by the probes' count (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn cgroup_slots(&self, cgroup_id: u64) -> u64 {
        let taken = self.taken.get(&cgroup_id, 0).unwrap_or(0);
        let returned = self.returned.get(&cgroup_id, 0).unwrap_or(0);
        taken.saturating_sub(returned)
    }

    /// Writes `per_cpu` as the statistics of `key`, taking a free slot if it has none (the
    /// scrape benchmark fills the table with synthetic entries this way, beside the probes).
    /// CPU `c`'s value goes to the copy CPU `c` would add to.
    pub fn write(&mut self, key: &SyscallKey, per_cpu: &[SyscallStats]) -> Result<(), TableError> {
        let slot = match self.slots.get(key, 0) {
            Ok(slot) => slot,
            Err(_) => {
                let slot = self.free.pop(0).map_err(|_| TableError::Full)?;
                // BPF_NOEXIST, as the probes do: if a probe gave the key a slot meanwhile, that
                // slot stays the key's and ours goes back.
                match self.slots.insert(key, slot, BPF_NOEXIST) {
                    Ok(()) => {
                        if key.tgid != FOLDED_TGID {
                            for count in [key.cgroup_id, quota_key::ALL_SLOTS] {
                                let taken = self.taken.get(&count, 0).unwrap_or(0);
                                let _ = self.taken.insert(count, taken + 1, 0);
                            }
                        }
                        slot
                    }
                    Err(e) => {
                        let _ = self.free.push(slot, 0);
                        self.slots
                            .get(key, 0)
                            .map_err(|_| map_err(maps::SYSCALL_SLOTS)(e))?
                    }
                }
            }
        };
        let mut copies = vec![
            SlotStats {
                key: *key,
                ..SlotStats::default()
            };
            self.stripes as usize
        ];
        for (cpu, stats) in per_cpu.iter().enumerate() {
            copies[cpu % self.stripes as usize].stats.add(stats);
        }
        for (stripe, copy) in copies.into_iter().enumerate() {
            self.stats
                .set(slot * self.stripes + stripe as u32, copy, 0)
                .map_err(map_err(maps::SYSCALL_STATS))?;
        }
        Ok(())
    }
}

/// Held slots at most this far apart are read in one range (reading a few free slots costs
/// less than another `bpf()` call).
const RANGE_GAP: u32 = 64;

/// The runs of `keys` (sorted by slot, `slot` of each) that are read as one range of the
/// array each (neighbours at most [`RANGE_GAP`] slots apart), with the array indices a run
/// covers: every copy of its slots, `stripes` a slot.
fn slot_runs<'a, K>(
    keys: &'a [K],
    slot: impl Fn(&K) -> u32 + 'a,
    stripes: u32,
) -> impl Iterator<Item = (Range<usize>, Range<u32>)> + 'a {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= keys.len() {
            return None;
        }
        let run = keys[start..]
            .windows(2)
            .position(|w| slot(&w[1]) - slot(&w[0]) > RANGE_GAP)
            .map_or(keys.len() - start, |i| i + 1);
        let held = start..start + run;
        start += run;
        let (first, last) = (slot(&keys[held.start]), slot(&keys[held.end - 1]));
        Some((
            held,
            first.saturating_mul(stripes)..(last + 1).saturating_mul(stripes),
        ))
    })
}

/// `BPF_NOEXIST`: create only.
const BPF_NOEXIST: u64 = 1;

/// Adds `copy` (copy `stripe` of `slot`) to the sum of the key it names, if that key holds
/// `slot`, and marks the copy as the key's. `keys` (sorted by slot) and `sums` run in step. A
/// slot is held by one key (two only while a probe and user space race on it): each counts the
/// copies that name it.
fn add_copy(
    keys: &[(SyscallKey, u32)],
    sums: &mut [(SyscallStats, u8)],
    (slot, stripe): (u32, u32),
    copy: &SlotStats,
) {
    let first = keys.partition_point(|(_, s)| *s < slot);
    for (i, (key, _)) in keys[first..]
        .iter()
        .enumerate()
        .take_while(|(_, (_, s))| *s == slot)
    {
        if copy.key == *key {
            let (sum, owned) = &mut sums[first + i];
            *owned |= 1 << stripe;
            sum.add(&copy.stats);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::test_support::require_root;

    fn key(tgid: u32, nr: u32) -> SyscallKey {
        SyscallKey {
            cgroup_id: 7,
            tgid,
            nr,
            fd: sysscope_abi::FdClass::NONE,
        }
    }

    fn copy(owner: SyscallKey, calls: u64) -> SlotStats {
        let mut stats = SyscallStats::ZERO;
        stats.buckets[3] = calls;
        stats.sum_ns = 100 * calls;
        SlotStats {
            key: owner,
            stats,
            ..SlotStats::default()
        }
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

    fn stats(calls: u64) -> SyscallStats {
        let mut s = SyscallStats::ZERO;
        s.buckets[2] = calls;
        s.sum_ns = 3000 * calls;
        s
    }

    fn table(capacity: u32, stripes: u32) -> SyscallStatsTable {
        SyscallStatsTable::new(TableMaps {
            slots: create(
                1, /* HASH */
                std::mem::size_of::<SyscallKey>() as u32,
                4,
                capacity,
            ),
            stats: create(
                2, /* ARRAY */
                4,
                std::mem::size_of::<SlotStats>() as u32,
                capacity * stripes,
            ),
            free: create(23 /* STACK */, 0, 4, capacity),
            epoch: create(2 /* ARRAY */, 4, 8, 1),
            taken: create(1 /* HASH */, 8, 8, 64),
            returned: create(1 /* HASH */, 8, 8, 64),
            states: create(
                2, /* ARRAY */
                4,
                std::mem::size_of::<StateStats>() as u32,
                capacity * stripes,
            ),
        })
        .unwrap()
    }

    /// A cgroup's shared key is freed while its cgroup lives: its slot goes only while it still
    /// holds what the last snapshot read, so a call counted after that read is never wiped.
    #[test]
    fn a_shared_key_is_freed_only_while_it_holds_what_was_read() {
        if !require_root("a_shared_key_is_freed_only_while_it_holds_what_was_read") {
            return;
        }
        let mut table = table(16, 2);
        table.free.push(3, 0).unwrap();
        let shared = key(FOLDED_TGID, 39);
        table.write(&shared, &[stats(2)]).unwrap();
        assert_eq!(table.snapshot().entries, vec![(shared, stats(2))]);
        // A call lands after the read: the key keeps its slot, and its values.
        table.write(&shared, &[stats(3)]).unwrap();
        assert!(table.remove(&[shared]).is_empty());
        assert_eq!(table.slots.get(&shared, 0).unwrap(), 3);
        assert_eq!(table.snapshot().entries, vec![(shared, stats(3))]);
        // Idle since that read: freed and zeroed, its slot back on the stack.
        assert_eq!(table.remove(&[shared]), vec![shared]);
        assert!(table.slots.get(&shared, 0).is_err());
        assert_eq!(table.free.pop(0).unwrap(), 3);
        assert_eq!(table.stats.get(&6, 0).unwrap(), SlotStats::default());
        assert!(table.snapshot().entries.is_empty());
    }

    /// The table over real kernel maps, with four copies per slot: keys at slots far apart
    /// (several read ranges), a copy left by a previous owner, frees that leave nothing behind
    /// and count the slots returned to their cgroup, and a freed slot handed to a new key that
    /// must start from zero.
    #[test]
    fn sparse_slots_are_read_exactly_and_freed_clean() {
        if !require_root("sparse_slots_are_read_exactly_and_freed_clean") {
            return;
        }
        let stripes = 4;
        let mut table = table(1000, stripes);
        assert_eq!(table.stripes(), stripes);
        // Popped in this order: 5, 6, 300, 301, 999 (three read ranges).
        for slot in [999, 301, 300, 6, 5] {
            table.free.push(slot, 0).unwrap();
        }
        let keys: Vec<SyscallKey> = (0..5).map(|i| key(100 + i, 39)).collect();
        for (i, k) in keys.iter().enumerate() {
            // Calls on "CPU" 0 and 7 (copies 0 and 3).
            let mut per_cpu = vec![SyscallStats::ZERO; 8];
            per_cpu[0] = stats(i as u64 + 1);
            per_cpu[7].sum_ns += 7;
            table.write(k, &per_cpu).unwrap();
        }
        assert_eq!(table.slots.get(&keys[4], 0).unwrap(), 999);
        assert_eq!(table.cgroup_slots(7), 5);
        assert_eq!(table.cgroup_slots(quota_key::ALL_SLOTS), 5);
        // Slot 6 (keys[1]): its last copy holds a previous owner's values, not keys[1]'s.
        table
            .stats
            .set(6 * stripes + 3, copy(key(1, 39), 1000), 0)
            .unwrap();
        let mut read = table.snapshot().entries;
        read.sort_unstable_by_key(|(k, _)| k.tgid);
        assert_eq!(table.keys_held(), 5);
        let want: Vec<(SyscallKey, SyscallStats)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let mut s = stats(i as u64 + 1);
                if i != 1 {
                    s.sum_ns += 7;
                }
                (*k, s)
            })
            .collect();
        assert_eq!(read, want);

        // Free slots 6 and 300: keys gone, copies zeroed, epoch bumped, slots free again,
        // returned to the cgroup's count. A key that holds no slot is gone too.
        let nobody = key(77, 1);
        let gone = table.remove(&[keys[1], keys[2], nobody]);
        assert_eq!(gone, [keys[1], keys[2], nobody]);
        assert!(table.slots.get(&keys[1], 0).is_err());
        assert!(table.slots.get(&keys[2], 0).is_err());
        for slot in [6, 300] {
            for stripe in 0..stripes {
                let c = table.stats.get(&(slot * stripes + stripe), 0).unwrap();
                assert_eq!(c, SlotStats::default(), "slot {slot} copy {stripe}");
            }
        }
        assert_eq!(table.epoch.get(&0, 0).unwrap(), 1);
        assert_eq!(table.cgroup_slots(7), 3);
        assert_eq!(table.cgroup_slots(quota_key::ALL_SLOTS), 3);
        let mut read = table.snapshot().entries;
        read.sort_unstable_by_key(|(k, _)| k.tgid);
        assert_eq!(
            read.iter().map(|(k, _)| k.tgid).collect::<Vec<_>>(),
            [100, 103, 104]
        );

        // The last slot freed is handed out first; the new key sees only its own calls.
        let newcomer = key(200, 0);
        table.write(&newcomer, &[stats(4)]).unwrap();
        assert_eq!(table.slots.get(&newcomer, 0).unwrap(), 300);
        let read = table.snapshot().entries;
        let (_, got) = read.iter().find(|(k, _)| *k == newcomer).unwrap();
        assert_eq!(*got, stats(4));
        assert_eq!(table.keys_held(), 4);

        // Counts of cgroups that hold nothing are forgotten; the others stay.
        table.taken.insert(8, 2, 0).unwrap();
        table.returned.insert(8, 2, 0).unwrap();
        table.forget_idle_cgroups();
        assert!(table.taken.get(&8, 0).is_err());
        assert!(table.returned.get(&8, 0).is_err());
        assert_eq!(table.cgroup_slots(7), 4);
    }

    #[test]
    fn only_the_copies_a_key_owns_count() {
        let mine = key(10, 39);
        let previous_owner = key(11, 39);
        let keys = [(key(9, 1), 3), (mine, 4), (key(12, 2), 5)];
        let mut sums = vec![(SyscallStats::ZERO, 0); 3];
        for (stripe, c) in [copy(mine, 5), copy(previous_owner, 1000), copy(mine, 2)]
            .iter()
            .enumerate()
        {
            add_copy(&keys, &mut sums, (4, stripe as u32), c);
        }
        assert_eq!(sums[1].0.count(), 7);
        assert_eq!(sums[1].0.sum_ns, 700);
        // Copies 0 and 2 are the key's; copy 1 is a previous owner's.
        assert_eq!((sums[0].1, sums[1].1, sums[2].1), (0, 0b101, 0));
    }
}
