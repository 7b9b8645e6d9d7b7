//! Durations written as "250ms", "10s", "5m", "1h" (the Prometheus style): the parser and
//! formatter the config file, the OTLP settings and the CLI flags share, and the serde
//! `with` helpers for `Duration` fields.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{s}` has no unit (use ms, s, m or h)"))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 250ms, 10s, 5m"))?;
    let scale = match unit {
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(format!(
                "`{other}` is not a duration unit (ns, us, ms, s, m, h)"
            ))
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn format(d: &Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}ns", d.as_nanos())
    }
}

pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(d))
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    parse(&s).map_err(serde::de::Error::custom)
}

/// A command-line duration: the config file's syntax, and a bare number means seconds.
pub(crate) fn parse_arg(s: &str) -> Result<Duration, String> {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return parse(&format!("{s}s"));
    }
    parse(s)
}
