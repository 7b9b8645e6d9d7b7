//! How metrics leave the agent: the HTTP endpoint (Prometheus text 0.0.4, OpenMetrics and the
//! Prometheus protobuf exposition) and OTLP (slow-call spans, metrics push).

pub mod format;
pub mod http;
pub mod otlp;
pub mod protobuf;
pub mod scrape;
pub mod web_config;
