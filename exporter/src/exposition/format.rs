//! Content negotiation between the Prometheus protobuf exposition (what Prometheus asks for
//! with native histograms enabled), OpenMetrics 1.0 and the Prometheus text format 0.0.4.
//!
//! The protobuf exposition is prometheus-client's own encoding of the same families
//! (`exposition::protobuf`); the text formats are not touched by it.
//!
//! prometheus-client writes OpenMetrics. The 0.0.4 text format carries the same samples and
//! differs only in the metadata lines the encoder writes for each family, which
//! [`openmetrics_to_prometheus_text`] writes anew: counters are typed under their `_total`
//! name, and there is no `# EOF`/`# UNIT`. Sample lines are copied as they are, never
//! searched or cut: they hold label values that tenants choose (process and cgroup names).
//! The encoder escapes a label value's newlines, so a line that starts with `# ` is always one
//! of its own metadata lines, never data. Exemplars are added to the OpenMetrics body only,
//! after encoding (`spans::exemplars`), so the text this function reads has none.

use crate::openmetrics::parse_descriptor;

/// The formats `/metrics` can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    /// Length-delimited `io.prometheus.client.MetricFamily` messages.
    Protobuf,
    OpenMetrics,
    PrometheusText,
}

/// The media type of the Prometheus protobuf exposition, and its two required parameters.
const PROTOBUF_MEDIA: &str = "application/vnd.google.protobuf";
const PROTOBUF_PROTO: &str = "io.prometheus.client.MetricFamily";
const PROTOBUF_ENCODING: &str = "delimited";

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Format::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
            Format::Protobuf => "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited",
        }
    }

    /// Picks the format from an `Accept` header: the entry with the highest q-value among the
    /// protobuf exposition (only as length-delimited `io.prometheus.client.MetricFamily`),
    /// OpenMetrics and text/plain, preferring them in that order on a tie; the 0.0.4 text
    /// when none is listed.
    pub fn negotiate(accept: Option<&str>) -> Format {
        let mut best: Option<(f32, Format)> = None;
        for part in accept.unwrap_or("").split(',') {
            let mut params = part.split(';').map(str::trim);
            let media = params.next().unwrap_or("").to_ascii_lowercase();
            let (mut q, mut proto, mut encoding) = (1.0f32, "", "");
            for (key, value) in params.filter_map(|p| p.split_once('=')) {
                let value = value.trim().trim_matches('"');
                match key.trim().to_ascii_lowercase().as_str() {
                    "q" => q = value.parse().unwrap_or(0.0),
                    "proto" => proto = value,
                    "encoding" => encoding = value,
                    _ => {}
                }
            }
            let format = match media.as_str() {
                PROTOBUF_MEDIA if proto == PROTOBUF_PROTO && encoding == PROTOBUF_ENCODING => {
                    Format::Protobuf
                }
                "application/openmetrics-text" => Format::OpenMetrics,
                "text/plain" | "*/*" | "text/*" => Format::PrometheusText,
                _ => continue,
            };
            // The variants are declared in the order a tie prefers them.
            if q > 0.0 && best.is_none_or(|(b, f)| q > b || (q == b && format < f)) {
                best = Some((q, format));
            }
        }
        best.map_or(Format::PrometheusText, |(_, f)| f)
    }
}

/// Rewrites prometheus-client's OpenMetrics output as Prometheus text format 0.0.4.
pub fn openmetrics_to_prometheus_text(om: &str) -> String {
    let mut out = String::with_capacity(om.len());
    // Comment lines are few (three per family): find the counters first.
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| match parse_descriptor(l) {
            Some(("TYPE", name, "counter")) => Some(name),
            _ => None,
        })
        .collect();
    for line in om.lines() {
        match parse_descriptor(line) {
            Some(("UNIT", _, _)) => {}
            Some(("TYPE", name, kind)) => match kind {
                "counter" => out.push_str(&format!("# TYPE {name}_total counter\n")),
                "info" => out.push_str(&format!("# TYPE {name}_info gauge\n")),
                "gauge" | "histogram" | "summary" => {
                    out.push_str(&format!("# TYPE {name} {kind}\n"))
                }
                _ => out.push_str(&format!("# TYPE {name} untyped\n")),
            },
            Some(("HELP", name, help)) if counters.contains(name) => {
                out.push_str(&format!("# HELP {name}_total {help}\n"));
            }
            _ if line == "# EOF" => {}
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        use Format::*;
        assert_eq!(Format::negotiate(None), PrometheusText);
        assert_eq!(Format::negotiate(Some("*/*")), PrometheusText);
        // What Prometheus 2.x sends.
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text")),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0.2, text/plain")),
            PrometheusText
        );
        assert_eq!(
            Format::negotiate(Some("application/openmetrics-text;q=0")),
            PrometheusText
        );
        assert_eq!(Format::negotiate(Some("garbage;;;q=x")), PrometheusText);
    }

    #[test]
    fn protobuf_negotiation() {
        use Format::*;
        // What Prometheus sends with native histograms enabled (2.42 and later).
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")),
            Protobuf
        );
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")),
            Protobuf
        );
        // Only the delimited encoding of MetricFamily messages.
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text,text/plain;q=0.1")),
            PrometheusText
        );
        assert_eq!(
            Format::negotiate(Some(
                "application/vnd.google.protobuf;proto=other.Message;encoding=delimited"
            )),
            PrometheusText
        );
        // A higher q-value wins; a tie goes to protobuf.
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.4,application/openmetrics-text;q=0.5")),
            OpenMetrics
        );
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.5,application/openmetrics-text;q=0.5")),
            Protobuf
        );
        assert_eq!(
            Format::negotiate(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0")),
            PrometheusText
        );
    }

    #[test]
    fn rewrites_counters_units_and_eof() {
        let om = "# HELP a_things Things.\n# TYPE a_things counter\na_things_total{x=\"1\"} 3\n# HELP g A gauge.\n# TYPE g gauge\n# UNIT g seconds\ng 1.5\n# EOF\n";
        let text = openmetrics_to_prometheus_text(om);
        assert_eq!(
            text,
            "# HELP a_things_total Things.\n# TYPE a_things_total counter\na_things_total{x=\"1\"} 3\n# HELP g A gauge.\n# TYPE g gauge\ng 1.5\n"
        );
    }

    /// Label values a tenant chooses pass through whole, whatever they contain.
    #[test]
    fn sample_lines_are_never_cut() {
        let om = "# HELP s S.\n# TYPE s counter\ns_total{comm=\"ok # {evil\",cgroup=\"/hash # {x\"} 1\ns_total{comm=\"# HELP x\"} 2\n# EOF\n";
        let text = openmetrics_to_prometheus_text(om);
        assert!(
            text.contains("s_total{comm=\"ok # {evil\",cgroup=\"/hash # {x\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("s_total{comm=\"# HELP x\"} 2\n"), "{text}");
    }
}
