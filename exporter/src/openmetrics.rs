//! The one reader of the exposition text sysscope writes (prometheus-client's OpenMetrics, and
//! the Prometheus text 0.0.4 made from it): descriptor lines (`# TYPE`, `# HELP`, `# UNIT`),
//! samples with unescaped labels, and exemplars. The exemplar annotator, the 0.0.4 rewrite,
//! `sysscope top --from` and the integration tests read the exposition through it (the OTLP
//! push and the protobuf exposition take the families typed). A leaf: it imports nothing from
//! the crate.

/// An exemplar attached to a sample (` # {labels} value [timestamp]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Exemplar {
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub timestamp: Option<f64>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    pub exemplar: Option<Exemplar>,
}

impl Sample {
    /// The value of label `name`.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find_map(|(k, v)| (k == name).then_some(v.as_str()))
    }
}

fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        v => v.parse().ok(),
    }
}

/// Parses `{a="x",b="y"}` at the start of `s`; returns the pairs and the rest after `}`.
fn parse_labels(s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut rest = s.strip_prefix('{')?;
    let mut labels = Vec::new();
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = rest.find('=')?;
        let name = rest[..eq].trim().to_string();
        rest = rest[eq + 1..].strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                other => value.push(other),
            }
        };
        labels.push((name, value));
        rest = &rest[end + 1..];
    }
}

/// Parses one sample line (not a comment).
pub fn parse_sample(line: &str) -> Option<Sample> {
    let line = line.trim_end_matches(['\n', '\r']);
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let (labels, rest) = if line[name_end..].starts_with('{') {
        parse_labels(&line[name_end..])?
    } else {
        (Vec::new(), &line[name_end..])
    };
    let rest = rest.trim_start();
    let (sample_part, exemplar_part) = match rest.find(" # ") {
        Some(i) => (&rest[..i], Some(&rest[i + 3..])),
        None => (rest, None),
    };
    let value = parse_value(sample_part.split_whitespace().next()?)?;
    let exemplar = exemplar_part.and_then(|e| {
        let (labels, rest) = parse_labels(e.trim_start())?;
        let mut parts = rest.split_whitespace();
        let value = parse_value(parts.next()?)?;
        let timestamp = parts.next().and_then(parse_value);
        Some(Exemplar {
            labels,
            value,
            timestamp,
        })
    });
    Some(Sample {
        name,
        labels,
        value,
        exemplar,
    })
}

/// A descriptor line, `# TYPE name counter`, `# HELP name text` or `# UNIT name seconds`, as
/// (keyword, family name, the rest); `None` for a sample line or another comment (`# EOF`).
pub fn parse_descriptor(line: &str) -> Option<(&str, &str, &str)> {
    let mut parts = line.strip_prefix("# ")?.splitn(3, ' ');
    let keyword = parts.next()?;
    let name = parts.next()?;
    Some((keyword, name, parts.next().unwrap_or("")))
}

/// The sample lines of an exposition (comments and blank lines left out), each parsed: `None`
/// for a line that does not parse.
pub fn sample_lines(text: &str) -> impl Iterator<Item = (&str, Option<Sample>)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| (l, parse_sample(l)))
}

/// Escapes a label value the way the text formats quote it.
fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A canonical text key for a label set: sorted by name, values escaped and quoted.
pub fn label_key<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(&str, &str)> = labels.into_iter().collect();
    pairs.sort_unstable();
    let mut key = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            key.push(',');
        }
        key.push_str(k);
        key.push_str("=\"");
        key.push_str(&escape_label_value(v));
        key.push('"');
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_escapes_and_exemplars() {
        let s = parse_sample(
            r#"x_bucket{le="0.5",cgroup="/a \"b\"\\c",comm="p"} 7 # {trace_id="ab",span_id="cd"} 0.25 1700000000.5"#,
        )
        .unwrap();
        assert_eq!(s.name, "x_bucket");
        assert_eq!(s.label("cgroup"), Some(r#"/a "b"\c"#));
        assert_eq!(s.label("le"), Some("0.5"));
        assert_eq!(s.value, 7.0);
        let e = s.exemplar.unwrap();
        assert_eq!(e.labels[0], ("trace_id".into(), "ab".into()));
        assert_eq!((e.value, e.timestamp), (0.25, Some(1_700_000_000.5)));
        let plain = parse_sample("up 1").unwrap();
        assert_eq!((plain.name.as_str(), plain.value), ("up", 1.0));
        assert!(plain.labels.is_empty());
        assert_eq!(
            parse_sample("h_bucket{le=\"+Inf\"} 3").unwrap().label("le"),
            Some("+Inf")
        );
        assert!(parse_sample("garbage").is_none());
    }

    #[test]
    fn descriptors_and_sample_lines() {
        assert_eq!(
            parse_descriptor("# TYPE a counter"),
            Some(("TYPE", "a", "counter"))
        );
        assert_eq!(
            parse_descriptor("# HELP a Some help."),
            Some(("HELP", "a", "Some help."))
        );
        assert_eq!(parse_descriptor("# EOF"), None);
        assert_eq!(parse_descriptor("a{b=\"# TYPE\"} 1"), None);
        let lines: Vec<_> = sample_lines("# TYPE a gauge\na 1\n\ngarbage\n# EOF\n").collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].1.as_ref().map(|s| s.value), Some(1.0));
        assert_eq!(lines[1], ("garbage", None));
    }

    #[test]
    fn label_keys_are_canonical() {
        let a = label_key([("b", "2"), ("a", "x\"y")]);
        let b = label_key([("a", "x\"y"), ("b", "2")]);
        assert_eq!(a, b);
        assert_eq!(a, r#"a="x\"y",b="2""#);
    }
}
