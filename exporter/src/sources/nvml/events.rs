//! XID errors from NVML events: a thread registers every device NVML lists for
//! `nvmlEventTypeXidCriticalError` in one event set and waits on it (`nvmlEventSetWait_v2`),
//! [`WAIT`] at a time so that it notices within that bound when it is asked to stop; it
//! counts each event by (device UUID, XID code) for [`super::Nvml::take_xid_errors`].
//!
//! Bounded: at most [`MAX_KEYS`] (device, code) pairs are counted between two takes (NVML
//! defines fewer than 200 codes); an event past that is counted under the code `None`
//! ("unknown"), never dropped. A wait that keeps failing (the driver went away) ends the
//! thread with one log line; the collector starts a new one when it initialises NVML again.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use nvml_wrapper::{
    bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError, EventSet, Nvml,
};

use super::XidKey;
use crate::util::error::Chain;

/// The longest a wait blocks, so stopping takes at most this long.
pub(crate) const WAIT: Duration = Duration::from_millis(500);

/// (device, code) pairs counted between two takes.
pub(crate) const MAX_KEYS: usize = 1024;

/// Failed waits in a row after which the thread gives up.
const MAX_FAILURES: u32 = 20;

type Counts = Arc<Mutex<BTreeMap<XidKey, u64>>>;

/// The running watch; stopping it (drop) waits for the thread, at most [`WAIT`].
pub(crate) struct XidWatch {
    stop: Arc<AtomicBool>,
    counts: Counts,
    thread: Option<JoinHandle<()>>,
}

impl XidWatch {
    pub(crate) fn start(nvml: Arc<Nvml>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Counts::default();
        let thread = std::thread::Builder::new()
            .name("sysscope-xid".into())
            .spawn({
                let (stop, counts) = (stop.clone(), counts.clone());
                move || watch(&nvml, &stop, &counts)
            });
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the thread that counts GPU XID errors");
                None
            }
        };
        Self {
            stop,
            counts,
            thread,
        }
    }

    /// What was counted since the previous take.
    pub(crate) fn take(&self) -> Vec<(XidKey, u64)> {
        std::mem::take(&mut *self.counts.lock().expect("xid counts lock"))
            .into_iter()
            .collect()
    }
}

impl Drop for XidWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One event set with every device that supports XID events registered. nvml-wrapper frees
/// the set when a registration fails, so a failure starts a new set with the devices so far.
fn register(nvml: &Nvml) -> Result<(EventSet<'_>, Vec<String>), NvmlError> {
    let count = nvml.device_count()?;
    let mut set = nvml.create_event_set()?;
    let mut watched: Vec<(u32, String)> = Vec::new();
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let supported = device
            .supported_event_types()
            .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
        let Ok(uuid) = device.uuid() else { continue };
        if !supported {
            tracing::info!(gpu = index, uuid = %uuid, "GPU does not report XID events; sysscope_gpu_xid_errors_total stays absent for it");
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                watched.push((index, uuid));
            }
            Err(e) => {
                tracing::warn!(gpu = index, uuid = %uuid, error = %Chain(&e.error), "cannot watch the GPU's XID events");
                set = nvml.create_event_set()?;
                for (i, _) in &watched {
                    let device = nvml.device_by_index(*i)?;
                    set = device
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|e| e.error)?;
                }
            }
        }
    }
    Ok((set, watched.into_iter().map(|(_, u)| u).collect()))
}

fn watch(nvml: &Nvml, stop: &AtomicBool, counts: &Mutex<BTreeMap<XidKey, u64>>) {
    let (set, watched) = match register(nvml) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %Chain(&e), "cannot watch GPU XID events; sysscope_gpu_xid_errors_total stays absent");
            return;
        }
    };
    if watched.is_empty() {
        return;
    }
    tracing::info!(gpus = watched.len(), "counting GPU XID errors");
    let timeout = WAIT.as_millis() as u32;
    let mut failures = 0;
    while !stop.load(Ordering::Relaxed) {
        match set.wait(timeout) {
            Ok(event) => {
                failures = 0;
                let Some(xid) = event.event_data else {
                    continue;
                };
                let Ok(uuid) = event.device.uuid() else {
                    continue;
                };
                let xid = match xid {
                    XidError::Value(v) => Some(v),
                    XidError::Unknown => None,
                };
                let mut counts = counts.lock().expect("xid counts lock");
                let mut key = XidKey { uuid, xid };
                if counts.len() >= MAX_KEYS && !counts.contains_key(&key) {
                    key.xid = None;
                }
                *counts.entry(key).or_insert(0) += 1;
            }
            Err(NvmlError::Timeout) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures >= MAX_FAILURES {
                    tracing::warn!(error = %Chain(&e), "GPU XID events: waiting keeps failing; no longer counting until NVML is initialised again");
                    return;
                }
                std::thread::sleep(WAIT);
            }
        }
    }
}
