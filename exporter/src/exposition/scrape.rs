//! One scrape: refresh the collectors (at most once per `collection.min_interval`) and encode.
//! Concurrent scrapes inside that interval share one read of the maps and one encoding per
//! format, so a burst of scrapers costs the kernel nothing extra. The text formats are
//! prometheus-client's text encoding (OpenMetrics, rewritten for 0.0.4); the protobuf
//! exposition and the OTLP push take the same families typed ([`Scraper::families`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use prometheus_client::{
    collector::Collector as PromCollector,
    encoding::{
        prometheus_protobuf::{self, prometheus_data_model::MetricFamily},
        DescriptorEncoder,
    },
    registry::Registry,
};

use super::{
    format::{openmetrics_to_prometheus_text, Format},
    protobuf,
};
use crate::{agent::Agent, config::ExpositionConfig, spans::exemplars::ExemplarStore};

/// Lets prometheus-client's encoder walk the agent's collectors.
#[derive(Debug)]
struct AgentView(Arc<Mutex<Agent>>);

impl PromCollector for AgentView {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.0.lock().expect("agent lock").encode(&mut encoder)
    }
}

#[derive(Default)]
struct Cache {
    refreshed_at: Option<Instant>,
    bodies: HashMap<Format, Bytes>,
}

pub struct Scraper {
    agent: Arc<Mutex<Agent>>,
    registry: Registry,
    min_interval: Duration,
    cache: Mutex<Cache>,
    exemplars: Option<Arc<ExemplarStore>>,
    /// What the protobuf exposition carries of the duration histograms.
    forms: ExpositionConfig,
}

impl Scraper {
    pub fn new(agent: Arc<Mutex<Agent>>, min_interval: Duration) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(AgentView(agent.clone())));
        Self {
            agent,
            registry,
            min_interval,
            cache: Mutex::new(Cache::default()),
            exemplars: None,
            forms: ExpositionConfig::default(),
        }
    }

    /// The forms of the duration histograms the protobuf exposition carries (native only by
    /// default), and the store whose slow calls are the exemplars of every format that
    /// carries them.
    pub(crate) fn with(mut self, forms: ExpositionConfig, exemplars: Arc<ExemplarStore>) -> Self {
        self.forms = forms;
        self.exemplars = Some(exemplars);
        self
    }

    /// Whether a panic left the agent or the scrape cache locked mid-update: every scrape then
    /// fails, so the process is not healthy and must be restarted.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.agent.is_poisoned() || self.cache.is_poisoned()
    }

    /// The exposition in `format`. Blocking (reads kernel maps): call from a blocking thread.
    pub fn scrape(&self, format: Format) -> Bytes {
        let mut cache = self.cache.lock().expect("scrape cache lock");
        let started = Instant::now();
        self.refresh_agent(&mut cache, self.min_interval);
        // Refreshing empties the cache: a body found was encoded since the last refresh.
        if let Some(body) = cache.bodies.get(&format) {
            return body.clone();
        }
        let body = match format {
            Format::OpenMetrics => {
                let mut om = self.openmetrics();
                if let Some(store) = &self.exemplars {
                    store.annotate(&mut om);
                }
                Bytes::from(om)
            }
            Format::PrometheusText => {
                Bytes::from(openmetrics_to_prometheus_text(&self.openmetrics()))
            }
            Format::Protobuf => Bytes::from(protobuf::encode_delimited(&self.typed(&self.forms))),
        };
        self.agent
            .lock()
            .expect("agent lock")
            .set_last_scrape(started.elapsed());
        cache.bodies.insert(format, body.clone());
        body
    }

    /// Every family typed, with both forms of the duration histograms and their exemplars,
    /// refreshed as a scrape would be (the OTLP push). Blocking, as [`Self::scrape`].
    pub(crate) fn families(&self) -> Vec<MetricFamily> {
        let mut cache = self.cache.lock().expect("scrape cache lock");
        self.refresh_agent(&mut cache, self.min_interval);
        self.typed(&protobuf::BOTH)
    }

    /// Refreshes the collectors unless the last refresh is younger than `max_age`.
    fn refresh_agent(&self, cache: &mut Cache, max_age: Duration) {
        if cache.refreshed_at.is_some_and(|t| t.elapsed() < max_age) {
            return;
        }
        self.agent.lock().expect("agent lock").refresh();
        cache.refreshed_at = Some(Instant::now());
        cache.bodies.clear();
    }

    fn openmetrics(&self) -> String {
        let mut om = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut om, &self.registry);
        om
    }

    fn typed(&self, forms: &ExpositionConfig) -> Vec<MetricFamily> {
        // The protobuf encoder fails only where a collector's own encoding does, and then
        // leaves nothing to serve: say so rather than serve an empty body unexplained.
        let mut families = match prometheus_protobuf::encode(&self.registry) {
            Ok(families) => families,
            Err(_) => {
                tracing::error!("a collector failed to encode its families as protobuf");
                Vec::new()
            }
        };
        protobuf::finish(&mut families, forms, self.exemplars.as_deref());
        families
    }

    /// Refreshes without encoding (the background tick that reclaims exited processes).
    pub fn refresh(&self) {
        let mut cache = self.cache.lock().expect("scrape cache lock");
        self.refresh_agent(&mut cache, Duration::ZERO);
    }
}
