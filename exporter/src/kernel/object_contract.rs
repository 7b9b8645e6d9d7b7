//! The contract between the embedded probes object and the ABI crate, checked without
//! privileges: every map, program and global a family of `sysscope_abi` declares exists in the
//! object, every map with the kind, key size and value size user space reads it as and every
//! global with the size the loader writes, and the object holds no map or program the ABI does
//! not declare. The declarations are the ABI's spec tables ([`sysscope_abi::FAMILIES`]), so a
//! map added to a family is checked without touching this file, and a map added to the probes
//! alone fails here.

use std::collections::HashSet;

use aya_obj::generated::bpf_map_type;
use object::{Object as _, ObjectSymbol as _};
use sysscope_abi::{MapKind, FAMILIES};

use crate::kernel::PROBES_OBJECT;

fn parsed() -> aya_obj::Object {
    aya_obj::Object::parse(PROBES_OBJECT).expect("the embedded probes object parses")
}

/// The kernel's map type of an ABI map kind.
fn bpf_type(kind: MapKind) -> u32 {
    (match kind {
        MapKind::Array => bpf_map_type::BPF_MAP_TYPE_ARRAY,
        MapKind::PerCpuArray => bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY,
        MapKind::HashMap => bpf_map_type::BPF_MAP_TYPE_HASH,
        MapKind::LruHashMap => bpf_map_type::BPF_MAP_TYPE_LRU_HASH,
        MapKind::Stack => bpf_map_type::BPF_MAP_TYPE_STACK,
        MapKind::RingBuf => bpf_map_type::BPF_MAP_TYPE_RINGBUF,
        MapKind::TaskStorage => bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE,
        MapKind::CgroupArray => bpf_map_type::BPF_MAP_TYPE_CGROUP_ARRAY,
    }) as u32
}

/// The names of one kind of item over every family, each declared once.
fn declared<'a>(items: impl Iterator<Item = &'a str>, what: &str) -> HashSet<&'a str> {
    let mut names = HashSet::new();
    for name in items {
        assert!(
            names.insert(name),
            "{what} `{name}` is declared twice in the ABI"
        );
    }
    assert!(!names.is_empty(), "the ABI declares no {what}");
    names
}

#[test]
fn every_abi_map_is_in_the_object_as_user_space_reads_it() {
    let object = parsed();
    let specs = FAMILIES.iter().flat_map(|f| f.maps);
    declared(specs.clone().map(|m| m.name), "map");
    for spec in specs {
        let name = spec.name;
        let map = object
            .maps
            .get(name)
            .unwrap_or_else(|| panic!("map `{name}` is declared in the ABI but not in the object"));
        assert_eq!(map.map_type(), bpf_type(spec.kind), "type of map `{name}`");
        // A ring buffer's records are framed by the kernel: the map itself has no key or
        // value, and the ABI's value is the record user space reads.
        let (key, value) = match spec.kind {
            MapKind::RingBuf => (0, 0),
            _ => (spec.key_size, spec.value_size),
        };
        assert_eq!(map.key_size() as usize, key, "key size of map `{name}`");
        assert_eq!(
            map.value_size() as usize,
            value,
            "value size of map `{name}`"
        );
    }
}

#[test]
fn every_map_of_the_object_is_declared_in_the_abi() {
    let object = parsed();
    let names = declared(FAMILIES.iter().flat_map(|f| f.maps).map(|m| m.name), "map");
    for (name, map) in &object.maps {
        // .bss, .data and .rodata are the globals' sections, not maps the probes declare.
        if map.symbol_index().is_none() {
            continue;
        }
        assert!(
            names.contains(name.as_str()),
            "map `{name}` is in the object but no ABI family declares it"
        );
    }
}

#[test]
fn the_abi_programs_are_the_objects() {
    let object = parsed();
    let names = declared(FAMILIES.iter().flat_map(|f| f.programs).copied(), "program");
    let in_object: HashSet<&str> = object.programs.keys().map(String::as_str).collect();
    assert_eq!(
        names, in_object,
        "programs declared in the ABI vs in the object"
    );
}

#[test]
fn every_abi_global_is_in_the_object_with_the_size_the_loader_writes() {
    let elf = object::File::parse(PROBES_OBJECT).expect("the embedded probes object is ELF");
    let specs = FAMILIES.iter().flat_map(|f| f.globals);
    declared(specs.clone().map(|g| g.name), "global");
    for spec in specs {
        let name = spec.name;
        let symbol = elf
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| {
                panic!("global `{name}` is declared in the ABI but not in the object")
            });
        assert_eq!(symbol.size() as usize, spec.size, "size of global `{name}`");
    }
}
