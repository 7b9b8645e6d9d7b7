//! The agent: the loaded probes and the running collectors in one table. It owns the probes
//! (their programs stay attached as long as it holds them, until [`Agent::detach`]), refreshes
//! the collectors in order, hands what they report about themselves to the self-metrics
//! collector ([`crate::collectors::self_metrics`]), which is refreshed last, and encodes every
//! collector's families, sysscope's own last.

use std::time::Duration;

use prometheus_client::encoding::DescriptorEncoder;

use crate::{
    collectors::{self_metrics::SelfMetrics, Collector, CollectorError, Health},
    kernel::Probes,
    util::error::Chain,
};

struct Slot {
    name: &'static str,
    collector: Option<Box<dyn Collector>>,
    up: bool,
    /// Failed at start: its collector, if any, only tells why (never refreshed, always down).
    failed: bool,
}

pub struct Agent {
    slots: Vec<Slot>,
    self_metrics: SelfMetrics,
    /// The loaded object: every program attached while this is held, detached on drop.
    probes: Option<Probes>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field(
                "collectors",
                &self
                    .slots
                    .iter()
                    .map(|s| (s.name, s.up))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// An agent without collectors yet; `probes` (when they loaded) stay alive as long as it.
    pub fn new(mut probes: Option<Probes>) -> Self {
        Self {
            slots: Vec::new(),
            self_metrics: SelfMetrics::new(probes.as_mut()),
            probes,
        }
    }

    /// Adds a running collector.
    pub fn add(&mut self, collector: Box<dyn Collector>) {
        self.slots.push(Slot {
            name: collector.name(),
            collector: Some(collector),
            up: true,
            failed: false,
        });
        self.hand_over();
    }

    /// Records a collector that could not start: exported as down.
    pub(crate) fn add_failed(&mut self, name: &'static str) {
        self.slots.push(Slot {
            name,
            collector: None,
            up: false,
            failed: true,
        });
        self.hand_over();
    }

    /// Records a collector that could not start but still exports what it knows about why
    /// (e.g. the GPU collector's count of GPUs on the PCI bus): exported as down, encoded,
    /// never refreshed.
    pub(crate) fn add_failed_with(&mut self, collector: Box<dyn Collector>) {
        self.slots.push(Slot {
            name: collector.name(),
            collector: Some(collector),
            up: false,
            failed: true,
        });
        self.hand_over();
    }

    /// sysscope's own metrics, where other parts of the agent register their families and
    /// take their typed counters.
    pub fn self_metrics(&mut self) -> &mut SelfMetrics {
        &mut self.self_metrics
    }

    pub fn probes(&self) -> Option<&Probes> {
        self.probes.as_ref()
    }

    /// Stops every collector (closing the maps they read) and drops the probes, which detaches
    /// every program and closes the object's maps. Returns how many programs the probes held
    /// (0 if they had not loaded, or were detached before). The agent still encodes afterwards:
    /// every collector reports itself down.
    pub fn detach(&mut self) -> usize {
        for slot in &mut self.slots {
            slot.collector = None;
            slot.up = false;
            slot.failed = true;
        }
        self.hand_over();
        self.probes
            .take()
            .map_or(0, |probes| probes.programs().len())
    }

    pub fn collectors_up(&self) -> Vec<(&'static str, bool)> {
        self.slots.iter().map(|s| (s.name, s.up)).collect()
    }

    /// Refreshes every collector, then the self-metrics with what the others reported; a
    /// failure marks that collector down until it succeeds again.
    pub(crate) fn refresh(&mut self) {
        for slot in &mut self.slots {
            if slot.failed {
                continue;
            }
            if let Some(c) = slot.collector.as_mut() {
                match c.refresh() {
                    Ok(()) => slot.up = true,
                    Err(e) => {
                        if slot.up {
                            tracing::warn!(collector = slot.name, error = %Chain(&e), "collector refresh failed");
                        }
                        slot.up = false;
                    }
                }
            }
        }
        self.hand_over();
        // Reading its own sources cannot fail in a way that hides the others' metrics: a
        // counter that could not be read keeps its last value.
        let _ = self.self_metrics.refresh(self.probes.as_ref());
    }

    /// Tells the self-metrics which collectors are up and what they report about themselves.
    fn hand_over(&mut self) {
        let health: Vec<Health> = self
            .slots
            .iter()
            .filter_map(|s| s.collector.as_ref().map(|c| c.health()))
            .collect();
        self.self_metrics.observe(self.collectors_up(), health);
    }

    /// Hands a reloaded configuration to every running collector; the first failure is
    /// returned with the collector's name (the others still got it).
    pub(crate) fn reconfigure(
        &mut self,
        config: &crate::config::Config,
    ) -> Result<(), (&'static str, CollectorError)> {
        let mut first_error = None;
        for slot in &mut self.slots {
            if slot.failed {
                continue;
            }
            if let Some(c) = slot.collector.as_mut() {
                if let Err(e) = c.reconfigure(config) {
                    first_error.get_or_insert((slot.name, e));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    pub(crate) fn set_last_scrape(&mut self, d: Duration) {
        self.self_metrics.set_last_scrape(d);
    }

    /// Encodes every collector's families, then the self-metrics.
    pub(crate) fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        for slot in &self.slots {
            if let Some(c) = &slot.collector {
                c.encode(encoder)?;
            }
        }
        self.self_metrics.encode(encoder, self.probes.as_ref())
    }
}
