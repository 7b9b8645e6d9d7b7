//! Giving freed heap memory back to the kernel.
//!
//! glibc keeps what the program frees in its arenas for reuse and returns it to the kernel
//! only from the top of the main heap. Process churn makes the collectors build large
//! transient tables (tens of thousands of keys and label sets read, routed and reclaimed in
//! one cycle); once they are freed, the pages stay resident, scattered between live
//! allocations, and the resident size stays at the burst's peak (docs/operations.md has the
//! figures). `malloc_trim` releases the free pages inside every arena as well.

use std::time::{Duration, Instant};

/// Releases the free pages of the allocator's arenas, at most once per `min_gap` (the walk
/// of the free lists costs about a millisecond per few tens of MB of heap). A no-op where the
/// allocator is not glibc's.
#[derive(Debug)]
pub(crate) struct HeapTrimmer {
    min_gap: Duration,
    last: Option<Instant>,
}

impl HeapTrimmer {
    pub(crate) fn new(min_gap: Duration) -> Self {
        Self {
            min_gap,
            last: None,
        }
    }

    /// Trims if `min_gap` has passed since the last trim; returns how long the trim took.
    pub(crate) fn maybe_trim(&mut self) -> Option<Duration> {
        if self.last.is_some_and(|at| at.elapsed() < self.min_gap) {
            return None;
        }
        let start = Instant::now();
        self.last = Some(start);
        release_free_heap();
        Some(start.elapsed())
    }
}

fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks and madvises the allocator's own free lists, under the
    // arenas' locks; it has no preconditions and is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_at_most_once_per_gap() {
        let mut trimmer = HeapTrimmer::new(Duration::from_secs(3600));
        assert!(trimmer.maybe_trim().is_some(), "the first call trims");
        assert!(trimmer.maybe_trim().is_none(), "within the gap: no trim");
        let mut every_time = HeapTrimmer::new(Duration::ZERO);
        assert!(every_time.maybe_trim().is_some());
        assert!(every_time.maybe_trim().is_some());
    }
}
