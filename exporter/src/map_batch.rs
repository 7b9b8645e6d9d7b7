//! Reading whole per-CPU hash maps with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+), which aya does
//! not offer: one syscall per [`CHUNK`] entries instead of two per entry (next key, lookup).
//!
//! The scrape benchmark measured it (docs/performance.md): reading 5,883 `SYSCALL_STATS`
//! entries took 54 ms key by key and 4.7 ms in batches, and every syscall sysscope makes also
//! runs every probe attached to the syscall tracepoints. Used by the syscall collector for
//! `SYSCALL_STATS` and `SYSCALL_ERRORS`; when the kernel refuses batch operations the collector
//! falls back to aya's iteration.

use std::{
    io,
    marker::PhantomData,
    os::fd::{AsFd, AsRawFd, OwnedFd},
};

use aya::{maps::Map, Pod};

/// Entries fetched per syscall.
pub const CHUNK: usize = 1024;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`, padded to the size the kernel may read.
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
    _pad: [u64; 8],
}

/// Reads every entry of a per-CPU hash map of `K` -> `V`.
#[derive(Debug)]
pub struct PerCpuBatchReader<K, V> {
    fd: OwnedFd,
    cpus: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
    _types: PhantomData<(K, V)>,
}

impl<K: Pod, V: Pod> PerCpuBatchReader<K, V> {
    /// A reader of `map` (a second descriptor of it, so `map` can still be used as usual).
    pub fn new(map: &Map, cpus: usize) -> io::Result<Self> {
        let data = match map {
            Map::PerCpuHashMap(data) => data,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "not a per-CPU hash map",
                ))
            }
        };
        let fd = data.fd().as_fd().try_clone_to_owned()?;
        Ok(Self {
            fd,
            cpus: cpus.max(1),
            keys: vec![0; size_of::<K>() * CHUNK],
            values: vec![0; Self::value_stride(cpus.max(1)) * CHUNK],
            _types: PhantomData,
        })
    }

    /// Bytes of one entry's values: the kernel rounds each CPU's value up to 8 bytes.
    fn value_stride(cpus: usize) -> usize {
        size_of::<V>().next_multiple_of(8) * cpus
    }

    /// Calls `f` with every entry's key and its per-CPU values; returns how many there were.
    /// Entries created or deleted meanwhile may or may not be seen, as with any iteration.
    pub fn for_each(&mut self, mut f: impl FnMut(K, &[V])) -> io::Result<usize> {
        let stride = Self::value_stride(self.cpus);
        let per_cpu = size_of::<V>().next_multiple_of(8);
        let mut token = 0u64;
        let mut first = true;
        let mut total = 0;
        let mut values: Vec<V> = Vec::with_capacity(self.cpus);
        loop {
            let mut next = 0u64;
            let mut attr = BatchAttr {
                in_batch: if first {
                    0
                } else {
                    &token as *const u64 as u64
                },
                out_batch: &mut next as *mut u64 as u64,
                keys: self.keys.as_mut_ptr() as u64,
                values: self.values.as_mut_ptr() as u64,
                count: CHUNK as u32,
                map_fd: self.fd.as_raw_fd() as u32,
                ..Default::default()
            };
            // SAFETY: the attribute points at buffers sized for CHUNK keys and values and at
            // 8-byte batch tokens (a hash map's token is a 4-byte bucket index).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_MAP_LOOKUP_BATCH,
                    &mut attr as *mut BatchAttr,
                    size_of::<BatchAttr>() as u32,
                )
            };
            let err = (r < 0).then(io::Error::last_os_error);
            let done = match &err {
                None => false,
                Some(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
                Some(_) => return Err(err.expect("error")),
            };
            let n = (attr.count as usize).min(CHUNK);
            for i in 0..n {
                // SAFETY: the kernel wrote `n` keys and value sets; any bit pattern is a valid
                // Pod, and unaligned reads are used for both.
                let key: K = unsafe {
                    std::ptr::read_unaligned(self.keys.as_ptr().add(i * size_of::<K>()).cast())
                };
                values.clear();
                for cpu in 0..self.cpus {
                    let at = i * stride + cpu * per_cpu;
                    values.push(unsafe {
                        std::ptr::read_unaligned(self.values.as_ptr().add(at).cast())
                    });
                }
                f(key, &values);
            }
            total += n;
            if done {
                return Ok(total);
            }
            first = false;
            token = next;
        }
    }
}
