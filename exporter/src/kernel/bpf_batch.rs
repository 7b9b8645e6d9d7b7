//! Batched reads of kernel maps (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+): hashes, per-CPU hashes and
//! ranges of per-CPU arrays.
//!
//! Reading a map entry by entry costs two `bpf()` calls per entry (next key, lookup), and
//! sysscope's own syscall probes trace each of them: reading a full 16,384-entry map took most
//! of a second on a busy two-core machine, long enough for a fork-heavy workload to fill the
//! map between two reads. One batch call returns hundreds of entries. Callers fall back to
//! aya's per-entry iteration when the kernel does not support batches ([`BatchError::Unsupported`]).

use std::os::fd::{AsRawFd, BorrowedFd};

use aya::Pod;

/// Entries asked for per batch call (grown when one hash bucket holds more).
pub const CHUNK: usize = 512;

#[derive(Debug, thiserror::Error)]
pub(crate) enum BatchError {
    #[error("this kernel does not support batched map lookups")]
    Unsupported,
    #[error("batched lookup failed")]
    Io(#[source] std::io::Error),
}

/// `union bpf_attr` for the batch commands (the `batch` member).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// One `BPF_MAP_LOOKUP_BATCH`; returns its errno (0 on success). The kernel writes back
/// `attr.count` and the out-batch token even when it fails part way.
///
/// # Safety
/// `attr`'s pointers must be valid for `attr.count` keys and values of the map's sizes.
unsafe fn lookup_batch(attr: &mut BatchAttr) -> i32 {
    // SAFETY: as the caller promises.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_LOOKUP_BATCH,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    }
}

/// Every entry of a per-CPU hash map: keys and, per key, one value per possible CPU.
#[cfg(test)]
pub(crate) fn lookup_all_percpu<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    nr_cpus: usize,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    // Per-CPU values are laid out with each CPU's value rounded up to 8 bytes.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    lookup(map, nr_cpus, stride)
}

/// Every entry of a hash map that is not per CPU.
pub(crate) fn lookup_all<K: Pod, V: Pod>(map: BorrowedFd<'_>) -> Result<Vec<(K, V)>, BatchError> {
    let all = lookup::<K, V>(map, 1, std::mem::size_of::<V>())?;
    Ok(all
        .into_iter()
        .filter_map(|(k, mut v)| Some((k, v.pop()?)))
        .collect())
}

/// Indices `range` of a per-CPU array, handed to `each` one at a time with their per-CPU values,
/// read in batches whose buffer stays under [`ARRAY_BUFFER_BYTES`] however many CPUs and
/// indices there are (so a caller can sum as it reads, never holding the whole range).
#[cfg(test)]
pub(crate) fn for_each_percpu_array_range<V: Pod>(
    map: BorrowedFd<'_>,
    nr_cpus: usize,
    range: std::ops::Range<u32>,
    each: impl FnMut(u32, &[V]),
) -> Result<(), BatchError> {
    // Per-CPU values are laid out with each CPU's value rounded up to 8 bytes.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    array_range(map, nr_cpus.max(1), stride, range, each)
}

/// Indices `range` of an array that is not per CPU, handed to `each` one at a time, read in
/// batches as [`for_each_percpu_array_range`] reads.
pub(crate) fn for_each_array_range<V: Pod>(
    map: BorrowedFd<'_>,
    range: std::ops::Range<u32>,
    mut each: impl FnMut(u32, &V),
) -> Result<(), BatchError> {
    array_range(
        map,
        1,
        std::mem::size_of::<V>(),
        range,
        |index, values: &[V]| {
            if let Some(value) = values.first() {
                each(index, value);
            }
        },
    )
}

/// Indices `range` of an array with `values_per_index` values of `stride` bytes per index.
fn array_range<V: Pod>(
    map: BorrowedFd<'_>,
    values_per_index: usize,
    stride: usize,
    range: std::ops::Range<u32>,
    mut each: impl FnMut(u32, &[V]),
) -> Result<(), BatchError> {
    let nr_cpus = values_per_index;
    let per_index = stride * nr_cpus;
    let chunk = (ARRAY_BUFFER_BYTES / per_index).clamp(1, CHUNK);
    let mut keys = vec![0u32; chunk];
    let mut values = vec![0u8; per_index * chunk];
    let mut per_cpu: Vec<V> = Vec::with_capacity(nr_cpus);
    let mut next = range.start;
    while next < range.end {
        let want = chunk.min((range.end - next) as usize);
        // The kernel continues after the index in `in_batch`; none starts at index 0.
        let mut token_in: u32 = next.wrapping_sub(1);
        let mut token_out: u32 = 0;
        let mut attr = BatchAttr {
            in_batch: if next == 0 {
                0
            } else {
                &mut token_in as *mut u32 as u64
            },
            out_batch: &mut token_out as *mut u32 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: want as u32,
            map_fd: map.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the buffers outlive the call and hold `count` keys and values.
        let errno = unsafe { lookup_batch(&mut attr) };
        let n = (attr.count as usize).min(want);
        for (i, index) in keys.iter().take(n).enumerate() {
            per_cpu.clear();
            let base = i * per_index;
            // SAFETY: the kernel wrote `n` entries of `nr_cpus` values of this stride.
            per_cpu.extend((0..nr_cpus).map(|cpu| unsafe {
                std::ptr::read_unaligned(values[base + cpu * stride..].as_ptr() as *const V)
            }));
            if *index < range.end {
                each(*index, &per_cpu);
            }
        }
        match errno {
            0 => {}
            // Past the array's last index.
            libc::ENOENT => return Ok(()),
            libc::EINVAL | libc::EOPNOTSUPP | 524 if n == 0 && next == range.start => {
                return Err(BatchError::Unsupported)
            }
            e => return Err(BatchError::Io(std::io::Error::from_raw_os_error(e))),
        }
        if n == 0 {
            return Ok(());
        }
        next = keys[n - 1].saturating_add(1);
    }
    Ok(())
}

/// The most a batched read of a per-CPU array buffers at once (fewer indices per call on nodes
/// with many CPUs).
pub(crate) const ARRAY_BUFFER_BYTES: usize = 4 << 20;

/// Every entry of a hash map, with `values_per_key` values of `stride` bytes each.
fn lookup<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    values_per_key: usize,
    stride: usize,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    let key_size = std::mem::size_of::<K>();
    let fd = map.as_raw_fd();
    let mut out = Vec::new();
    let mut chunk = CHUNK;
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    loop {
        let mut keys = vec![0u8; key_size * chunk];
        let mut values = vec![0u8; stride * values_per_key * chunk];
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut token_in as *mut u64 as u64
            },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: the buffers outlive the call and hold `count` keys and values.
        let errno = unsafe { lookup_batch(&mut attr) };
        let n = (attr.count as usize).min(chunk);
        for i in 0..n {
            // SAFETY: the kernel wrote `n` keys and `n * values_per_key` values of these sizes.
            let key: K =
                unsafe { std::ptr::read_unaligned(keys[i * key_size..].as_ptr() as *const K) };
            let base = i * stride * values_per_key;
            let per_cpu: Vec<V> = (0..values_per_key)
                // SAFETY: as for the key: each CPU's value lies within the `n` values written.
                .map(|cpu| unsafe {
                    std::ptr::read_unaligned(values[base + cpu * stride..].as_ptr() as *const V)
                })
                .collect();
            out.push((key, per_cpu));
        }
        match errno {
            0 => {}
            libc::ENOENT => return Ok(out),
            // A bucket holds more entries than fit: retry with room for them.
            libc::ENOSPC if n == 0 && chunk < 1 << 16 => {
                chunk *= 4;
                continue;
            }
            libc::EINVAL | libc::EOPNOTSUPP | 524 if first && n == 0 => {
                return Err(BatchError::Unsupported)
            }
            e => return Err(BatchError::Io(std::io::Error::from_raw_os_error(e))),
        }
        token_in = token_out;
        first = false;
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};

    use super::*;
    use crate::util::test_support::require_root;

    fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> libc::c_long {
        // SAFETY: attr is a zero-padded bpf_attr of the size passed.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
    }

    /// A per-CPU hash map of `entries` u64 keys, filled from user space (root only), read back
    /// in several batches.
    #[test]
    fn reads_every_entry_of_a_percpu_hash_in_batches() {
        if !require_root("reads_every_entry_of_a_percpu_hash_in_batches") {
            return;
        }
        let nr_cpus = aya::util::nr_cpus().unwrap();
        let entries = 3 * CHUNK as u32 + 17;
        let mut attr = [0u8; 128];
        // map_type BPF_MAP_TYPE_PERCPU_HASH (5), key_size 8, value_size 16, max_entries.
        for (i, v) in [5u32, 8, 16, entries].iter().enumerate() {
            attr[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let fd = bpf(0, &mut attr);
        assert!(fd >= 0, "map create: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor we own.
        let map = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        for key in 0..entries as u64 {
            // Each CPU's value: [key * 10 + cpu, cpu].
            let values: Vec<[u64; 2]> = (0..nr_cpus as u64).map(|c| [key * 10 + c, c]).collect();
            let mut attr = [0u8; 128];
            attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
            attr[8..16].copy_from_slice(&(&key as *const u64 as u64).to_ne_bytes());
            attr[16..24].copy_from_slice(&(values.as_ptr() as u64).to_ne_bytes());
            assert_eq!(bpf(2 /* BPF_MAP_UPDATE_ELEM */, &mut attr), 0);
        }
        let all = lookup_all_percpu::<u64, [u64; 2]>(map.as_fd(), nr_cpus).unwrap();
        assert_eq!(all.len(), entries as usize);
        let mut keys: Vec<u64> = all.iter().map(|(k, _)| *k).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), entries as usize, "every key exactly once");
        for (key, per_cpu) in &all {
            assert_eq!(per_cpu.len(), nr_cpus);
            for (cpu, v) in per_cpu.iter().enumerate() {
                assert_eq!(*v, [key * 10 + cpu as u64, cpu as u64]);
            }
        }
        // An empty map reads as empty.
        let mut attr = [0u8; 128];
        for (i, v) in [5u32, 8, 16, 4].iter().enumerate() {
            attr[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let fd = bpf(0, &mut attr);
        // SAFETY: a new descriptor we own.
        let empty = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        assert!(lookup_all_percpu::<u64, [u64; 2]>(empty.as_fd(), nr_cpus)
            .unwrap()
            .is_empty());
    }

    /// Creates a map: (type, key size, value size, max entries).
    fn create(map_type: u32, key_size: u32, value_size: u32, entries: u32) -> OwnedFd {
        let mut attr = [0u8; 128];
        for (i, v) in [map_type, key_size, value_size, entries].iter().enumerate() {
            attr[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
        }
        let fd = bpf(0, &mut attr);
        assert!(fd >= 0, "map create: {}", std::io::Error::last_os_error());
        // SAFETY: a new descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd as i32) }
    }

    fn update<K, V: ?Sized>(map: &OwnedFd, key: &K, value: &V) {
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(key as *const K as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(value as *const V as *const u8 as u64).to_ne_bytes());
        assert_eq!(bpf(2 /* BPF_MAP_UPDATE_ELEM */, &mut attr), 0);
    }

    #[test]
    fn reads_a_hash_with_values_smaller_than_8_bytes() {
        if !require_root("reads_a_hash_with_values_smaller_than_8_bytes") {
            return;
        }
        let entries = 2 * CHUNK as u32 + 5;
        let map = create(1 /* BPF_MAP_TYPE_HASH */, 16, 4, entries);
        for i in 0..entries as u64 {
            update(&map, &[i, !i], &(i as u32 * 3));
        }
        let mut all = lookup_all::<[u64; 2], u32>(map.as_fd()).unwrap();
        all.sort_unstable();
        assert_eq!(all.len(), entries as usize);
        for (i, (key, value)) in all.iter().enumerate() {
            assert_eq!(*key, [i as u64, !(i as u64)]);
            assert_eq!(*value, i as u32 * 3);
        }
    }

    #[test]
    fn reads_exactly_the_requested_ranges_of_a_percpu_array() {
        if !require_root("reads_exactly_the_requested_ranges_of_a_percpu_array") {
            return;
        }
        let nr_cpus = aya::util::nr_cpus().unwrap();
        let size = 4 * CHUNK as u32;
        let map = create(6 /* BPF_MAP_TYPE_PERCPU_ARRAY */, 4, 12, size);
        for i in 0..size {
            // 12-byte values: each CPU's value is padded to 16 bytes in the buffer.
            let values: Vec<[u32; 4]> = (0..nr_cpus as u32).map(|c| [i, c, i + c, 0]).collect();
            update(&map, &i, values.as_slice());
        }
        let c = CHUNK as u32;
        // Empty, from 0, from the middle across chunk boundaries, to the end, and past it.
        for range in [
            0..0,
            0..1,
            0..c + 3,
            5..6,
            c - 1..2 * c + 1,
            3 * c..4 * c,
            4 * c - 2..u32::MAX,
        ] {
            let mut seen = Vec::new();
            for_each_percpu_array_range::<[u32; 3]>(
                map.as_fd(),
                nr_cpus,
                range.clone(),
                |i, per_cpu| {
                    assert_eq!(per_cpu.len(), nr_cpus);
                    for (cpu, v) in per_cpu.iter().enumerate() {
                        assert_eq!(*v, [i, cpu as u32, i + cpu as u32], "index {i}");
                    }
                    seen.push(i);
                },
            )
            .unwrap();
            let expected: Vec<u32> = (range.start..range.end.min(size)).collect();
            assert_eq!(seen, expected, "range {range:?}");
        }
    }
}
