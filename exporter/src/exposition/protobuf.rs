//! The Prometheus protobuf exposition: length-delimited `io.prometheus.client.MetricFamily`
//! messages, what Prometheus asks for when native histograms are enabled.
//!
//! The families are prometheus-client's encoding of what every collector writes (the same
//! calls that produce the text formats, into the client_model messages that prometheus-client
//! generates at build time from its `metrics.proto`, serialized with prost). The duration
//! histograms (`sysscope_syscall_duration_seconds`, `sysscope_block_io_duration_seconds`)
//! come with both their classic buckets and their native form, built from the kernel's
//! buckets by `hist.rs`; [`finish`] keeps the forms `[exposition]` asks for. Exemplars
//! of slow calls are added from the exemplar store by label set, as typed messages: the native
//! histogram's list, and the classic bucket that holds the call's duration. The same typed
//! families feed the OTLP metrics push.

use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    Exemplar, Histogram, LabelPair, MetricFamily, MetricType,
};
use prost::Message;

use crate::{
    config::ExpositionConfig,
    spans::exemplars::{ExemplarStore, RecentCall, EXEMPLAR_FAMILY},
};

/// Both forms of the duration histograms, for consumers that pick one themselves (the OTLP
/// push).
pub(crate) const BOTH: ExpositionConfig = ExpositionConfig {
    native_histograms: true,
    classic_histograms: true,
};

/// Whether a histogram message carries a native histogram: a zero bucket or any span (an
/// empty native histogram has the no-op span).
pub(crate) fn is_native(h: &Histogram) -> bool {
    h.zero_threshold > 0.0 || !h.positive_span.is_empty() || !h.negative_span.is_empty()
}

/// The classic form of `h` alone.
fn drop_native(h: &mut Histogram) {
    *h = Histogram {
        sample_count: h.sample_count,
        sample_count_float: h.sample_count_float,
        sample_sum: h.sample_sum,
        bucket: std::mem::take(&mut h.bucket),
        start_timestamp: h.start_timestamp.take(),
        ..Histogram::default()
    };
}

/// Keeps the histogram forms asked for, adds exemplars, and drops families without a metric.
pub(crate) fn finish(
    families: &mut Vec<MetricFamily>,
    forms: &ExpositionConfig,
    exemplars: Option<&ExemplarStore>,
) {
    families.retain(|f| !f.metric.is_empty());
    for family in families.iter_mut() {
        if family.r#type != MetricType::Histogram as i32 {
            continue;
        }
        let annotate = exemplars.filter(|_| family.name == EXEMPLAR_FAMILY);
        for metric in &mut family.metric {
            let Some(h) = metric.histogram.as_mut() else {
                continue;
            };
            if is_native(h) {
                // A histogram needs one form at least: the classic buckets go only where the
                // native one stays.
                if !forms.native_histograms {
                    drop_native(h);
                } else if !forms.classic_histograms {
                    h.bucket.clear();
                }
            }
            if let Some(store) = annotate {
                let calls = store.of_series(metric.label.iter().map(|l| (&*l.name, &*l.value)));
                add_exemplars(h, &calls);
            }
        }
    }
}

fn exemplar(call: &RecentCall) -> Exemplar {
    let pair = |name: &str, value: &str| LabelPair {
        name: name.to_string(),
        value: value.to_string(),
    };
    Exemplar {
        label: vec![
            pair("trace_id", &call.trace_id),
            pair("span_id", &call.span_id),
        ],
        value: call.duration_ns as f64 / 1e9,
        timestamp: Some(prost_types::Timestamp {
            seconds: (call.end_unix_ns / 1_000_000_000) as i64,
            nanos: (call.end_unix_ns % 1_000_000_000) as i32,
        }),
    }
}

/// Every remembered call goes to a native histogram's list; a classic bucket takes the most
/// recent call whose duration it holds (upper bounds inclusive, as `le` is).
fn add_exemplars(h: &mut Histogram, calls: &[RecentCall]) {
    if calls.is_empty() {
        return;
    }
    if is_native(h) {
        h.exemplars = calls.iter().map(exemplar).collect();
    }
    let mut lower = f64::NEG_INFINITY;
    for bucket in &mut h.bucket {
        let upper = bucket.upper_bound;
        let held = |c: &&RecentCall| {
            let s = c.duration_ns as f64 / 1e9;
            s > lower && s <= upper
        };
        if let Some(call) = calls.iter().rev().find(held) {
            bucket.exemplar = Some(exemplar(call));
        }
        lower = upper;
    }
}

/// The families as one length-delimited protobuf body.
pub(crate) fn encode_delimited(families: &[MetricFamily]) -> Vec<u8> {
    let mut out = Vec::with_capacity(families.iter().map(|f| f.encoded_len() + 4).sum());
    for family in families {
        // Writing to a Vec cannot run out of room.
        let _ = family.encode_length_delimited(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
        Bucket, BucketSpan, Metric,
    };

    use super::*;

    /// Reads a length-delimited body back.
    fn decode_delimited(mut body: &[u8]) -> Result<Vec<MetricFamily>, prost::DecodeError> {
        let mut out = Vec::new();
        while !body.is_empty() {
            out.push(MetricFamily::decode_length_delimited(&mut body)?);
        }
        Ok(out)
    }

    fn family(h: Histogram, name: &str) -> MetricFamily {
        MetricFamily {
            name: name.into(),
            r#type: MetricType::Histogram as i32,
            metric: vec![Metric {
                label: vec![LabelPair {
                    name: "comm".into(),
                    value: "x".into(),
                }],
                histogram: Some(h),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn both() -> Histogram {
        Histogram {
            sample_count: 3,
            sample_sum: 0.1,
            bucket: vec![
                Bucket {
                    cumulative_count: 1,
                    upper_bound: 0.0625,
                    ..Default::default()
                },
                Bucket {
                    cumulative_count: 3,
                    upper_bound: f64::INFINITY,
                    ..Default::default()
                },
            ],
            schema: -1,
            zero_threshold: 2f64.powi(-20),
            positive_span: vec![BucketSpan {
                offset: -2,
                length: 1,
            }],
            positive_delta: vec![3],
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_forms_asked_for() {
        let forms = |native_histograms, classic_histograms| ExpositionConfig {
            native_histograms,
            classic_histograms,
        };
        let mut f = vec![family(both(), "h")];
        finish(&mut f, &forms(true, false), None);
        let h = f[0].metric[0].histogram.as_ref().unwrap();
        assert!(h.bucket.is_empty() && is_native(h));
        let mut f = vec![family(both(), "h")];
        finish(&mut f, &forms(false, true), None);
        let h = f[0].metric[0].histogram.as_ref().unwrap();
        assert!(!is_native(h) && h.bucket.len() == 2 && h.schema == 0);
        let mut f = vec![family(both(), "h")];
        finish(&mut f, &BOTH, None);
        assert_eq!(f[0].metric[0].histogram.as_ref().unwrap(), &both());
        // A classic-only histogram keeps its buckets whatever is asked.
        let mut classic = both();
        drop_native(&mut classic);
        let mut f = vec![family(classic.clone(), "h")];
        finish(&mut f, &forms(true, false), None);
        assert_eq!(f[0].metric[0].histogram.as_ref().unwrap(), &classic);
        // Families without a metric are left out.
        let mut f = vec![MetricFamily::default()];
        finish(&mut f, &BOTH, None);
        assert!(f.is_empty());
    }

    #[test]
    fn exemplars_go_to_the_native_list_and_the_bucket_of_their_duration() {
        let call = |ms: u64, id: u8| RecentCall {
            duration_ns: ms * 1_000_000,
            end_unix_ns: 1_700_000_000_500_000_000,
            trace_id: format!("{id:02x}").repeat(16),
            span_id: format!("{id:02x}").repeat(8),
        };
        let mut h = both();
        add_exemplars(&mut h, &[call(40, 1), call(100, 2)]);
        assert_eq!(h.exemplars.len(), 2);
        let e = h.bucket[0].exemplar.as_ref().unwrap();
        assert_eq!(
            (e.value, e.label[0].value.as_str()),
            (0.04, &*"01".repeat(16))
        );
        assert_eq!(
            e.timestamp,
            Some(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 500_000_000
            })
        );
        assert_eq!(h.bucket[1].exemplar.as_ref().unwrap().value, 0.1);
    }

    #[test]
    fn delimited_round_trip() {
        let f = vec![family(both(), "a"), family(both(), "b")];
        let body = encode_delimited(&f);
        assert_eq!(decode_delimited(&body).unwrap(), f);
    }
}
