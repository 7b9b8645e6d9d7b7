//! Batched reads of kernel hash maps (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6+).
//!
//! Reading a map entry by entry costs two `bpf()` calls per entry (next key, lookup), and
//! sysscope's own syscall probes trace each of them: reading a full 16,384-entry map took most
//! of a second on a busy two-core machine, long enough for a fork-heavy workload to fill the
//! map between two reads. One batch call returns hundreds of entries. Callers fall back to
//! aya's per-entry iteration when the kernel does not support batches ([`BatchError::Unsupported`]).

use std::os::fd::{AsFd, AsRawFd};

use aya::{maps::MapData, Pod};

/// Entries asked for per call (grown when one hash bucket holds more).
const CHUNK: usize = 512;

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
    map: &MapData,
    nr_cpus: usize,
) -> Result<Vec<(K, Vec<V>)>, BatchError> {
    // Per-CPU values are laid out with each CPU's value rounded up to 8 bytes.
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    let key_size = std::mem::size_of::<K>();
    let fd = map.fd().as_fd().as_raw_fd();
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
