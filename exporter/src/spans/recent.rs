//! The most recent slow calls, kept in memory (at most `slow_calls.recent_capacity`) and served
//! as JSON at [`ROUTE`], so slow calls are visible without any tracing backend.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use super::{event::SlowCall, SpanSink};
use crate::collectors::self_metrics::SpanCounters;

/// Where the recent slow calls are served.
pub(crate) const ROUTE: &str = "/api/v1/slow-calls";

/// What the route answers: a content type and a body.
pub(crate) type Route = Arc<dyn Fn() -> (&'static str, Bytes) + Send + Sync>;

#[derive(Debug)]
pub(crate) struct RecentCalls {
    capacity: usize,
    calls: Mutex<VecDeque<Arc<SlowCall>>>,
    /// Counts each call kept as exported to `local`: set when the recent calls are the spans'
    /// destination (no OTLP endpoint), so `exported` never counts one span twice.
    local: Option<SpanCounters>,
}

impl RecentCalls {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity,
            calls: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            local: None,
        }
    }

    /// Counts every call kept in `counters` as exported to `local`.
    pub(crate) fn counted_as_local(mut self, counters: SpanCounters) -> Self {
        self.local = Some(counters);
        self
    }

    /// Keeps `call`, forgetting the oldest when full. Returns whether it was kept.
    pub(crate) fn push(&self, call: Arc<SlowCall>) -> bool {
        if self.capacity == 0 {
            return false;
        }
        let mut calls = self.calls.lock().expect("recent calls lock");
        while calls.len() >= self.capacity {
            calls.pop_front();
        }
        calls.push_back(call);
        true
    }

    /// Newest first.
    pub(crate) fn snapshot(&self) -> Vec<Arc<SlowCall>> {
        let calls = self.calls.lock().expect("recent calls lock");
        calls.iter().rev().cloned().collect()
    }

    /// The JSON document of [`ROUTE`].
    pub(crate) fn to_json(&self, enabled: bool) -> Bytes {
        let calls: Vec<serde_json::Value> = self.snapshot().iter().map(|c| c.to_json()).collect();
        let doc = serde_json::json!({
            "enabled": enabled,
            "capacity": self.capacity,
            "slow_calls": calls,
        });
        Bytes::from(serde_json::to_vec_pretty(&doc).unwrap_or_default())
    }

    /// The JSON route; `enabled` says whether slow calls are sampled at all.
    pub(crate) fn route(self: &Arc<Self>, enabled: bool) -> Route {
        let calls = self.clone();
        Arc::new(move || ("application/json", calls.to_json(enabled)))
    }
}

impl SpanSink for RecentCalls {
    fn deliver(&self, call: &Arc<SlowCall>, _series_labels: &[(&'static str, String)]) {
        if self.push(call.clone()) {
            if let Some(local) = &self.local {
                local.exported("local").inc();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn call(n: u64) -> Arc<SlowCall> {
        Arc::new(SlowCall {
            trace_id: [1; 16],
            span_id: [2; 8],
            name: Cow::Borrowed("read"),
            start_unix_ns: n,
            end_unix_ns: n + 1,
            duration_ns: 1,
            error: None,
            attributes: vec![],
        })
    }

    #[test]
    fn bounded_newest_first() {
        let r = RecentCalls::new(3);
        for n in 0..5 {
            assert!(r.push(call(n)));
        }
        let s: Vec<u64> = r.snapshot().iter().map(|c| c.start_unix_ns).collect();
        assert_eq!(s, [4, 3, 2]);
        let doc: serde_json::Value = serde_json::from_slice(&r.to_json(true)).unwrap();
        assert_eq!(doc["capacity"], 3);
        assert_eq!(doc["slow_calls"].as_array().unwrap().len(), 3);
        assert_eq!(doc["slow_calls"][0]["start_time_unix_nano"], 4);
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let r = RecentCalls::new(0);
        assert!(!r.push(call(1)));
        assert!(r.snapshot().is_empty());
    }
}
