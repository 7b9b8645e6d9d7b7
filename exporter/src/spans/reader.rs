//! Drains the slow-call ring buffer (`SLOW_EVENTS`) as the kernel fills it.
//!
//! The ring buffer's file descriptor becomes readable when records are committed; a tokio
//! `AsyncFd` waits for that without a polling interval. Records are copied out (they are
//! small and the kernel's rate limit bounds them) and what only `/proc` can tell (the
//! executable; a file's path when the kernel could not read it) is read at once, since it is
//! gone when the process exits; a readlink or so per record, bounded by the rate limit. The rest of the enrichment
//! takes the labeler lock the collectors share, so it runs on a blocking thread and the
//! runtime's workers keep serving HTTP.

use std::sync::{Arc, Mutex};

use tokio::io::{unix::AsyncFd, Interest};

use super::{event, SpanSink};
use crate::{
    collectors::self_metrics::SpanCounters,
    kernel::slow_events::{Malformed, SlowEvents},
    util::error::Chain,
};

/// Records handled per wake-up at most, so one burst cannot starve the runtime.
const MAX_BATCH: usize = 1024;

/// Spawns the reader task on the current tokio runtime.
pub(crate) fn spawn(
    ring: SlowEvents,
    enricher: Arc<Mutex<event::Enricher>>,
    sinks: Arc<[Arc<dyn SpanSink>]>,
    counters: SpanCounters,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let (resolve_paths, proc_root) = {
        let e = enricher.lock().expect("enricher lock");
        (e.resolve_paths(), e.proc_root().to_path_buf())
    };
    // SAFETY: the ring buffer owns its map's file descriptor for as long as it lives, and the
    // AsyncFd owns the ring buffer: the descriptor stays open and the same until both are
    // dropped.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok(tokio::spawn(async move {
        loop {
            // The probes ask for a wake-up per record; the timer is a safety net should one
            // still be missed (a record waiting for an unrelated wake-up arrives late, and the
            // process whose paths it needs may be gone by then).
            let ready = tokio::time::timeout(DRAIN_INTERVAL, fd.readable_mut()).await;
            let mut guard = match ready {
                Ok(Ok(g)) => g,
                Ok(Err(e)) => {
                    tracing::error!(error = %Chain(&e), "slow-call ring buffer cannot be watched; no more spans");
                    return;
                }
                Err(_) => {
                    let events = drain(fd.get_mut(), resolve_paths, &proc_root, &counters);
                    if !events.is_empty() {
                        deliver(&enricher, &sinks, events).await;
                    }
                    continue;
                }
            };
            let events = drain(guard.get_inner_mut(), resolve_paths, &proc_root, &counters);
            // Drained: wait for the next wake-up. Otherwise come back for the rest at once.
            if events.len() < MAX_BATCH {
                guard.clear_ready();
            }
            drop(guard);
            if events.is_empty() {
                continue;
            }
            deliver(&enricher, &sinks, events).await;
        }
    }))
}

/// Longest a committed record can wait in the ring buffer if its wake-up was missed.
const DRAIN_INTERVAL: std::time::Duration = std::time::Duration::from_millis(200);

type Captured = Vec<(sysscope_abi::SlowCallEvent, event::ProcContext)>;

/// Reads up to [`MAX_BATCH`] records, each with the `/proc` context taken at once (the process
/// may be about to exit).
fn drain(
    ring: &mut SlowEvents,
    resolve_paths: bool,
    proc_root: &std::path::Path,
    counters: &SpanCounters,
) -> Captured {
    let mut events = Vec::new();
    for record in ring.by_ref() {
        match record {
            Ok(record) => events.push((
                record.event,
                event::ProcContext::capture(
                    &record.event,
                    &record.file_name,
                    resolve_paths,
                    proc_root,
                ),
            )),
            Err(Malformed) => {
                counters.dropped("malformed").inc();
            }
        }
        if events.len() >= MAX_BATCH {
            break;
        }
    }
    events
}

/// Enriches and hands the records to the sinks on a blocking thread (the labeler lock).
async fn deliver(
    enricher: &Arc<Mutex<event::Enricher>>,
    sinks: &Arc<[Arc<dyn SpanSink>]>,
    events: Captured,
) {
    let enricher = enricher.clone();
    let sinks = sinks.clone();
    let done = tokio::task::spawn_blocking(move || {
        let mut enricher = enricher.lock().expect("enricher lock");
        for (ev, ctx) in events {
            super::deliver(&sinks, enricher.enrich_with(&ev, ctx));
        }
    })
    .await;
    if let Err(e) = done {
        tracing::error!(error = %Chain(&e), "enriching slow calls failed");
    }
}
