//! The contract between the embedded probes object and the ABI crate, checked without
//! privileges: every map, program and global the ABI names exists in the object, and every map
//! key and value (and every global) has the size of the type user space reads it as.
//!
//! The names are taken from the ABI's source (its `maps`, `programs` and `globals` modules), so
//! a name added there is checked without touching this file; a map or global added there also
//! needs its user-side types in [`MAP_TYPES`] / [`GLOBAL_TYPES`], or the test says so.

use std::mem::size_of;

use object::{Object as _, ObjectSymbol as _};
use sysscope_abi::{
    globals, maps, BlockInflight, BlockKey, BlockLatency, BlockLatencyKey, BlockProbeConfig,
    BlockStats, CpuState, ErrnoKey, FdProbeConfig, ProcessExit, RateWindow, SlotStats, SyscallKey,
    ThreadSpill, TraceThread,
};

use crate::kernel::PROBES_OBJECT;

const ABI_SOURCE: &str = include_str!("../../../ebpf/abi/src/lib.rs");

/// (map, key size, value size) as user space reads them; `None` for ring buffers, whose
/// records are framed by the kernel rather than sized by the map.
const MAP_TYPES: &[(&str, Option<(usize, usize)>)] = &[
    // Task storage: the key is the task's pid file descriptor.
    (
        maps::SYSCALL_THREADS,
        Some((size_of::<i32>(), size_of::<ThreadSpill>())),
    ),
    (
        maps::SYSCALL_CPU,
        Some((size_of::<u32>(), size_of::<CpuState>())),
    ),
    (
        maps::SYSCALL_STATS,
        Some((size_of::<u32>(), size_of::<SlotStats>())),
    ),
    (
        maps::SYSCALL_SLOTS,
        Some((size_of::<SyscallKey>(), size_of::<u32>())),
    ),
    // A stack has no key.
    (maps::FREE_SLOTS, Some((0, size_of::<u32>()))),
    (maps::SLOT_EPOCH, Some((size_of::<u32>(), size_of::<u64>()))),
    (
        maps::SYSCALL_ERRORS,
        Some((size_of::<ErrnoKey>(), size_of::<u64>())),
    ),
    (
        maps::PROCESS_EXITS,
        Some((size_of::<u32>(), size_of::<ProcessExit>())),
    ),
    (
        maps::PROBE_COUNTERS,
        Some((size_of::<u32>(), size_of::<u64>())),
    ),
    (
        maps::SLOW_THRESHOLDS,
        Some((size_of::<u32>(), size_of::<u64>())),
    ),
    (maps::SLOW_EVENTS, None),
    // Slots taken and returned per cgroup id (the per-cgroup quota).
    (
        maps::CGROUP_TAKEN,
        Some((size_of::<u64>(), size_of::<u64>())),
    ),
    (
        maps::CGROUP_RETURNED,
        Some((size_of::<u64>(), size_of::<u64>())),
    ),
    (
        maps::SLOW_RATE,
        Some((size_of::<u32>(), size_of::<RateWindow>())),
    ),
    (
        maps::BLOCK_INFLIGHT,
        Some((size_of::<u64>(), size_of::<BlockInflight>())),
    ),
    (
        maps::BLOCK_STATS,
        Some((size_of::<BlockKey>(), size_of::<BlockStats>())),
    ),
    (
        maps::BLOCK_LATENCY,
        Some((size_of::<BlockLatencyKey>(), size_of::<BlockLatency>())),
    ),
    (maps::TRACE_EVENTS, None),
    (
        maps::TRACE_THREADS,
        Some((size_of::<u32>(), size_of::<TraceThread>())),
    ),
    (
        maps::TRACE_TARGETS,
        Some((size_of::<u32>(), size_of::<u8>())),
    ),
    // A cgroup array holds file descriptors.
    (
        maps::TRACE_CGROUPS,
        Some((size_of::<u32>(), size_of::<u32>())),
    ),
    (
        maps::TRACE_PATH_ARGS,
        Some((size_of::<u32>(), size_of::<u8>())),
    ),
    (maps::TRACE_BLOCK_EVENTS, None),
];

/// (global, size of the value the loader writes into it).
const GLOBAL_TYPES: &[(&str, usize)] = &[
    (globals::SLOW_EVENTS_PER_CPU_PER_SEC, size_of::<u32>()),
    (globals::TRACE_CGROUP_ID, size_of::<u64>()),
    (globals::TRACE_FILTER_TGIDS, size_of::<u32>()),
    (globals::SYSCALL_TARGET_ONLY, size_of::<u32>()),
    (globals::BLOCK_CONFIG, size_of::<BlockProbeConfig>()),
    (globals::BLOCK_TRACE, size_of::<u32>()),
    (globals::SYSCALL_STAT_STRIPES, size_of::<u32>()),
    (globals::SYSCALL_CGROUP_QUOTA, size_of::<u32>()),
    (globals::FD_CONFIG, size_of::<FdProbeConfig>()),
];

/// The string constants of `pub mod <module> { ... }` in the ABI source.
fn abi_names(module: &str) -> Vec<String> {
    let open = format!("pub mod {module} {{");
    let start = ABI_SOURCE
        .find(&open)
        .unwrap_or_else(|| panic!("the ABI has no `{open}`"));
    let body = &ABI_SOURCE[start + open.len()..];
    let body = &body[..body.find("\n}").expect("module closes")];
    let names: Vec<String> = body
        .lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("pub const ")?;
            let (_, value) = rest.split_once(": &str = \"")?;
            Some(value.split('"').next()?.to_string())
        })
        .collect();
    assert!(!names.is_empty(), "no names found in the ABI's `{module}`");
    names
}

fn parsed() -> aya_obj::Object {
    aya_obj::Object::parse(PROBES_OBJECT).expect("the embedded probes object parses")
}

#[test]
fn every_abi_map_is_in_the_object_with_the_sizes_user_space_reads() {
    let object = parsed();
    let names = abi_names("maps");
    assert_eq!(names.len(), MAP_TYPES.len(), "maps in the ABI vs MAP_TYPES");
    for name in names {
        let map = object
            .maps
            .get(&name)
            .unwrap_or_else(|| panic!("map `{name}` is named in the ABI but not in the object"));
        let (_, sizes) = MAP_TYPES
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("map `{name}`: add its user-side types to MAP_TYPES"));
        if let Some((key, value)) = *sizes {
            assert_eq!(map.key_size() as usize, key, "key size of map `{name}`");
            assert_eq!(
                map.value_size() as usize,
                value,
                "value size of map `{name}`"
            );
        }
    }
}

#[test]
fn every_abi_program_is_in_the_object() {
    let object = parsed();
    for name in abi_names("programs") {
        assert!(
            object.programs.contains_key(&name),
            "program `{name}` is named in the ABI but not in the object (it has {:?})",
            object.programs.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn every_abi_global_is_in_the_object_with_the_size_the_loader_writes() {
    let elf = object::File::parse(PROBES_OBJECT).expect("the embedded probes object is ELF");
    let names = abi_names("globals");
    assert_eq!(
        names.len(),
        GLOBAL_TYPES.len(),
        "globals in the ABI vs GLOBAL_TYPES"
    );
    for name in names {
        let symbol = elf
            .symbols()
            .find(|s| s.name() == Ok(name.as_str()))
            .unwrap_or_else(|| panic!("global `{name}` is named in the ABI but not in the object"));
        let (_, size) = GLOBAL_TYPES
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("global `{name}`: add its type to GLOBAL_TYPES"));
        assert_eq!(symbol.size() as usize, *size, "size of global `{name}`");
    }
}
