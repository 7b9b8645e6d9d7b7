//! The exporter's log lines in logfmt (`--log.format logfmt`, the default): the formatter the
//! binary installs in its `tracing` subscriber.

/// logfmt lines: `ts=<RFC 3339> level=info target=<module> msg="..." key=value ...`, the
/// fields of the event's spans (outermost first) after its own.
pub struct Logfmt;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Logfmt
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime;
        let meta = event.metadata();
        let mut ts = String::new();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut ts))?;
        let mut fields = LogfmtFields::default();
        event.record(&mut fields);
        write!(
            writer,
            "ts={ts} level={} target={}",
            meta.level().as_str().to_ascii_lowercase(),
            logfmt_value(meta.target())
        )?;
        write!(writer, " msg={}", logfmt_value(&fields.message))?;
        for (key, value) in &fields.pairs {
            write!(writer, " {key}={}", logfmt_value(value))?;
        }
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(formatted) = span
                    .extensions()
                    .get::<tracing_subscriber::fmt::FormattedFields<N>>()
                {
                    if !formatted.is_empty() {
                        write!(writer, " span={}", logfmt_value(span.name()))?;
                        write!(writer, " span_fields={}", logfmt_value(formatted))?;
                    }
                }
            }
        }
        writeln!(writer)
    }
}

/// An event's message and other fields, as text.
#[derive(Default)]
struct LogfmtFields {
    message: String,
    pairs: Vec<(&'static str, String)>,
}

impl tracing::field::Visit for LogfmtFields {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.pairs.push((field.name(), value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            self.pairs.push((field.name(), text));
        }
    }
}

/// A logfmt value: bare when it is a plain token, else quoted with `\`, `"` and control
/// characters escaped.
fn logfmt_value(value: &str) -> std::borrow::Cow<'_, str> {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c == ' ' || c == '=' || c == '"' || c == '\\' || c.is_control());
    if plain {
        return value.into();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out.into()
}

#[cfg(test)]
mod tests {
    use super::logfmt_value;

    #[test]
    fn logfmt_values_are_bare_or_quoted_and_escaped() {
        assert_eq!(logfmt_value("info"), "info");
        assert_eq!(logfmt_value("127.0.0.1:9812"), "127.0.0.1:9812");
        assert_eq!(logfmt_value(""), "\"\"");
        assert_eq!(logfmt_value("serving metrics"), "\"serving metrics\"");
        assert_eq!(logfmt_value("a=b"), "\"a=b\"");
        assert_eq!(
            logfmt_value("say \"hi\"\\\n\u{1b}"),
            "\"say \\\"hi\\\"\\\\\\n\\u{1b}\""
        );
    }
}
