//! Drains the slow-call ring buffer (`SLOW_EVENTS`) as the kernel fills it.
//!
//! The ring buffer's file descriptor becomes readable when records are committed; a tokio
//! `AsyncFd` waits for that without a polling interval. Records are copied out (they are
//! small and the kernel's rate limit bounds them) and what only `/proc` can tell (executable,
//! descriptor path) is read at once, since it is gone when the process exits or closes the
//! descriptor; two readlinks per record, bounded by the rate limit. The rest of the enrichment
//! takes the labeler lock the collectors share, so it runs on a blocking thread and the
//! runtime's workers keep serving HTTP.

use std::sync::{Arc, Mutex};

use aya::maps::{MapData, RingBuf};
use tokio::io::{unix::AsyncFd, Interest};

use super::{event, Sinks};
use crate::exposition::otlp::Stats;

/// Records handled per wake-up at most, so one burst cannot starve the runtime.
const MAX_BATCH: usize = 1024;

/// Spawns the reader task on the current tokio runtime.
pub fn spawn(
    ring: RingBuf<MapData>,
    enricher: Arc<Mutex<event::Enricher>>,
    sinks: Arc<Sinks>,
    stats: Arc<Stats>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let (resolve_paths, proc_root) = {
        let e = enricher.lock().expect("enricher lock");
        (e.resolve_paths(), e.proc_root().to_path_buf())
    };
    // SAFETY: the RingBuf owns its map's file descriptor for as long as it lives, and the
    // AsyncFd owns the RingBuf: the descriptor stays open and the same until both are dropped.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(tokio::spawn(async move {
        loop {
            let mut guard = match fd.readable_mut().await {
                Ok(g) => g,
                Err(e) => {
                    tracing::error!(error = %e, "slow-call ring buffer cannot be watched; no more spans");
                    return;
                }
            };
            let mut events = Vec::new();
            {
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    match event::decode(&item) {
                        // The /proc part first: the process may be about to exit.
                        Some(ev) => events.push((
                            ev,
                            event::ProcContext::capture(&ev, resolve_paths, &proc_root),
                        )),
                        None => Stats::add(&stats.dropped_malformed, 1),
                    }
                    if events.len() >= MAX_BATCH {
                        break;
                    }
                }
            }
            // Drained: wait for the next wake-up. Otherwise come back for the rest at once.
            if events.len() < MAX_BATCH {
                guard.clear_ready();
            }
            drop(guard);
            if events.is_empty() {
                continue;
            }
            let enricher = enricher.clone();
            let sinks = sinks.clone();
            let done = tokio::task::spawn_blocking(move || {
                let mut enricher = enricher.lock().expect("enricher lock");
                for (ev, ctx) in events {
                    sinks.deliver(enricher.enrich_with(&ev, ctx));
                }
            })
            .await;
            if let Err(e) = done {
                tracing::error!(error = %e, "enriching slow calls failed");
            }
        }
    }))
}
