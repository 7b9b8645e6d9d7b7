//! How metrics leave the agent: the HTTP endpoint (Prometheus text 0.0.4 and OpenMetrics)
//! and OTLP (slow-call spans, metrics push).

pub mod format;
pub mod http;
pub mod otlp;
pub mod scrape;
pub mod web_config;
