//! XID errors from NVML events: a thread registers every device NVML lists for
//! `nvmlEventTypeXidCriticalError` in one event set and waits on it (`nvmlEventSetWait_v2`),
//! [`WAIT`] at a time so that it notices within that bound when it is asked to stop; it
//! counts each event by (device UUID, XID code) for [`super::Nvml::take_xid_errors`].
//!
//! Bounded: at most [`MAX_KEYS`] (device, code) pairs are counted between two takes (NVML
//! defines fewer than 200 codes); an event past that is counted under the code `None`
//! ("unknown"), never dropped. One lost GPU does not stop the others' counts: a wait that
//! fails (a device of the set fell off the bus: `GPU_IS_LOST`) makes the set again with the
//! devices that still answer, and a device the set lacks that answers again (the collector
//! reads it: [`XidWatch::notice`]) is added. The thread ends when NVML is dropped; the
//! collector starts a new one when it initialises NVML again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nvml_wrapper::{
    bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError, EventSet, Nvml,
};

use super::XidKey;
use crate::util::error::Chain;

/// The longest a wait blocks, so stopping takes at most this long.
pub(crate) const WAIT: Duration = Duration::from_millis(500);

/// How long to wait before trying again when no event set can be made at all.
const RETRY: Duration = Duration::from_secs(5);

/// (device, code) pairs counted between two takes.
pub(crate) const MAX_KEYS: usize = 1024;

type Counts = Arc<Mutex<BTreeMap<XidKey, u64>>>;

/// The running watch; stopping it (drop) waits for the thread, at most [`WAIT`].
pub(crate) struct XidWatch {
    stop: Arc<AtomicBool>,
    counts: Counts,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the thread and the readers of devices share.
#[derive(Default)]
struct Shared {
    /// Devices the thread has dealt with: in the set, or without XID events.
    known: Mutex<BTreeSet<String>>,
    /// A device it has not dealt with answers: add it to the set.
    recheck: AtomicBool,
}

impl XidWatch {
    pub(crate) fn start(nvml: Arc<Nvml>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Counts::default();
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name("sysscope-xid".into())
            .spawn({
                let (stop, counts, shared) = (stop.clone(), counts.clone(), shared.clone());
                move || watch(&nvml, &stop, &counts, &shared)
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
            shared,
            thread,
        }
    }

    /// Device `uuid` answered: if the event set lacks it (it came back after being lost, or
    /// appeared), the thread adds it at its next wait.
    pub(crate) fn notice(&self, uuid: &str) {
        if !self
            .shared
            .known
            .lock()
            .expect("xid known lock")
            .contains(uuid)
        {
            self.shared.recheck.store(true, Ordering::Relaxed);
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

/// The devices in the event set (by UUID), and those found not to report XID events (logged
/// once each).
#[derive(Default)]
struct Registered {
    watched: Vec<String>,
    unsupported: BTreeSet<String>,
}

/// Adds to `set` every device NVML lists that reports XID events and is not in it yet; a
/// device that does not answer now is left for a later call. nvml-wrapper frees the set when a
/// registration fails, so a failure starts a new set with the devices registered so far.
fn register<'n>(
    nvml: &'n Nvml,
    mut set: EventSet<'n>,
    reg: &mut Registered,
) -> Result<EventSet<'n>, NvmlError> {
    let count = nvml.device_count()?;
    for index in 0..count {
        let Ok(device) = nvml.device_by_index(index) else {
            continue;
        };
        let Ok(uuid) = device.uuid() else { continue };
        if reg.watched.contains(&uuid) || reg.unsupported.contains(&uuid) {
            continue;
        }
        let supported = match device.supported_event_types() {
            Ok(t) => t.contains(EventTypes::CRITICAL_XID_ERROR),
            Err(NvmlError::NotSupported) => false,
            // Not answering now (lost, or not ready): looked at again later.
            Err(_) => continue,
        };
        if !supported {
            tracing::info!(gpu = index, uuid = %uuid, "GPU does not report XID events; sysscope_gpu_xid_errors_total stays absent for it");
            reg.unsupported.insert(uuid);
            continue;
        }
        match device.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                reg.watched.push(uuid);
            }
            Err(e) => {
                tracing::debug!(gpu = index, uuid = %uuid, error = %Chain(&e.error), "cannot watch the GPU's XID events now");
                set = nvml.create_event_set()?;
                for uuid in &reg.watched {
                    set = nvml
                        .device_by_uuid(uuid.as_str())?
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|e| e.error)?;
                }
            }
        }
    }
    Ok(set)
}

/// Sleeps `d`, or less when asked to stop; whether to go on.
fn pause(stop: &AtomicBool, d: Duration) -> bool {
    let until = Instant::now() + d;
    while Instant::now() < until {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(WAIT.min(until.saturating_duration_since(Instant::now())));
    }
    !stop.load(Ordering::Relaxed)
}

fn watch(nvml: &Nvml, stop: &AtomicBool, counts: &Mutex<BTreeMap<XidKey, u64>>, shared: &Shared) {
    let timeout = WAIT.as_millis() as u32;
    let mut reg = Registered::default();
    let publish = |reg: &Registered| {
        *shared.known.lock().expect("xid known lock") = reg
            .watched
            .iter()
            .chain(&reg.unsupported)
            .cloned()
            .collect();
    };
    // What was last logged, so that a failure that repeats is logged once.
    let mut reported: Option<String> = None;
    let mut counting = 0;
    while !stop.load(Ordering::Relaxed) {
        reg.watched.clear();
        shared.recheck.store(false, Ordering::Relaxed);
        let set = nvml
            .create_event_set()
            .and_then(|set| register(nvml, set, &mut reg));
        let mut set = match set {
            Ok(set) => set,
            Err(e) => {
                let why = Chain(&e).to_string();
                if reported.as_deref() != Some(why.as_str()) {
                    tracing::warn!(error = %why, "cannot watch GPU XID events; trying again");
                    reported = Some(why);
                }
                if pause(stop, RETRY) {
                    continue;
                }
                return;
            }
        };
        publish(&reg);
        loop {
            if reg.watched.len() != counting {
                counting = reg.watched.len();
                tracing::info!(gpus = counting, "counting GPU XID errors");
            }
            if stop.load(Ordering::Relaxed) {
                return;
            }
            if shared.recheck.swap(false, Ordering::Relaxed) {
                set = match register(nvml, set, &mut reg) {
                    Ok(set) => set,
                    // The set was freed: made again from scratch.
                    Err(_) => break,
                };
                publish(&reg);
                continue;
            }
            if reg.watched.is_empty() {
                if !pause(stop, WAIT) {
                    return;
                }
                continue;
            }
            match set.wait(timeout) {
                Ok(event) => {
                    reported = None;
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
                Err(NvmlError::Timeout) => {}
                Err(e) => {
                    // A device of the set is lost (or the set broke): the set is made again
                    // with the devices that still answer, so that theirs go on being counted.
                    let why = Chain(&e).to_string();
                    if reported.as_deref() != Some(why.as_str()) {
                        tracing::warn!(error = %why, "waiting for GPU XID events failed; watching the GPUs that still answer");
                        reported = Some(why);
                    }
                    if !pause(stop, WAIT) {
                        return;
                    }
                    break;
                }
            }
        }
    }
}
