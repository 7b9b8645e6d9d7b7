//! How metrics leave the agent: the HTTP endpoint (Prometheus text 0.0.4 and OpenMetrics)
//! and, later in the pipeline, OTLP.

pub mod format;
pub mod http;
pub mod scrape;
pub mod web_config;
