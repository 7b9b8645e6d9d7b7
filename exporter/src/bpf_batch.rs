//! Batched reads of kernel hash maps (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+).
//!
//! Reading a map entry by entry costs two `bpf()` calls per entry (next key, lookup), and
//! sysscope's own syscall probes trace each of them: reading a full 16,384-entry map took most
//! of a second on a busy two-core machine, long enough for a fork-heavy workload to fill the
//! map between two reads. One batch call returns hundreds of entries. Callers fall back to
//! aya's per-entry iteration when the kernel does not support batches ([`BatchError::Unsupported`]).

use std::os::fd::{AsRawFd, BorrowedFd};

use aya::Pod;

/// Entries asked for per call (grown when one hash bucket holds more).
/// Entries asked for per batch call.
pub const CHUNK: usize = 512;

#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("this kernel does not support batched map lookups")]
    Unsupported,
    #[error("batched lookup failed: {0}")]
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

/// Every entry of a per-CPU hash map: keys and, per key, one value per possible CPU.
pub fn lookup_all_percpu<K: Pod, V: Pod>(
    map: BorrowedFd<'_>,
    nr_cpus: usize,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    // Per-CPU values are laid out with each CPU's value rounded up to 8 bytes.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    let key_size = std::mem::size_of::<K>();
    let fd = map.as_raw_fd();
    let mut out = Vec::new();
    let mut chunk = CHUNK;
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    loop {
        let mut keys = vec![0u8; key_size * chunk];
        let mut values = vec![0u8; stride * nr_cpus * chunk];
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
        // SAFETY: attr points at buffers of `count` keys and values of the map's sizes, and at
        // two u64 batch tokens (hash maps use a u32 bucket index); the kernel writes back
        // `count` and fills at most that many entries.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let errno = if r < 0 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            0
        };
        let n = (attr.count as usize).min(chunk);
        for i in 0..n {
            // SAFETY: the kernel wrote `n` keys and values; Pod types accept any bytes.
            let key: K =
                unsafe { std::ptr::read_unaligned(keys[i * key_size..].as_ptr() as *const K) };
            let base = i * stride * nr_cpus;
            let per_cpu: Vec<V> = (0..nr_cpus)
                .map(|cpu| unsafe {
                    std::ptr::read_unaligned(values[base + cpu * stride..].as_ptr() as *const V)
                })
                .collect();
            out.push((key, per_cpu));
        }
        match errno {
            0 => {}
            // The whole map has been read.
            libc::ENOENT => return Ok(out),
            // One bucket holds more entries than `count`: ask for more at once.
            libc::ENOSPC if n == 0 && chunk < 1 << 16 => {
                chunk *= 4;
                continue;
            }
            // EINVAL/EOPNOTSUPP from old kernels, ENOTSUPP (524, kernel-internal) for map types
            // without batch support.
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

    fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> libc::c_long {
        // SAFETY: attr is a zero-padded bpf_attr of the size passed.
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) }
    }

    /// A per-CPU hash map of `entries` u64 keys, filled from user space (root only), read back
    /// in several batches.
    #[test]
    fn reads_every_entry_of_a_percpu_hash_in_batches() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIPPED reads_every_entry_of_a_percpu_hash_in_batches: needs root");
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
}
