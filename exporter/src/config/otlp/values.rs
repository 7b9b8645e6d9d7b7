//! Parsing the values of OTLP settings: `key=value` lists, header maps, percent-decoding
//! and the resource attributes.

use super::*;

/// Parses the W3C-baggage-like lists of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES`: `key=value,key2=value2`, values percent-encoded.
pub(crate) fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}` is not key=value"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("`{item}` has an empty key"));
        }
        out.push((k.to_string(), percent_decode(v.trim())?));
    }
    Ok(out)
}

/// Header names and values as HTTP headers, or what is wrong with the first that is not one.
pub(super) fn header_map(pairs: &[(String, String)]) -> Result<HeaderMap, String> {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        let bad = |what: &str| format!("`{name}`: not a valid header {what}");
        let key = HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("name"))?;
        let mut value = HeaderValue::from_str(value).map_err(|_| bad("value"))?;
        // Often a credential: kept out of debug output.
        value.set_sensitive(true);
        map.insert(key, value);
    }
    Ok(map)
}

pub(super) fn percent_decode(s: &str) -> Result<String, String> {
    // percent-encoding leaves a malformed escape as it is; the OTLP lists are refused instead.
    let malformed = s
        .split('%')
        .skip(1)
        .any(|rest| rest.len() < 2 || !rest.as_bytes()[..2].iter().all(u8::is_ascii_hexdigit));
    if malformed {
        return Err(format!("bad percent-encoding in `{s}`"));
    }
    percent_decode_str(s)
        .decode_utf8()
        .map(|v| v.into_owned())
        .map_err(|_| format!("`{s}` is not UTF-8 once decoded"))
}

pub(super) fn resource(
    get: &Lookup<'_>,
    node_name: Option<&str>,
    host_name: &str,
) -> Result<Vec<(String, String)>, SettingsError> {
    let mut attrs: Vec<(String, String)> = match get("OTEL_RESOURCE_ATTRIBUTES") {
        Some(f) => parse_key_values(&f.value).map_err(|p| invalid(&f, p))?,
        None => Vec::new(),
    };
    let mut set = |k: &str, v: String, override_existing: bool| match attrs
        .iter_mut()
        .find(|(key, _)| key == k)
    {
        Some(slot) if override_existing => slot.1 = v,
        Some(_) => {}
        None => attrs.push((k.to_string(), v)),
    };
    // OTEL_SERVICE_NAME wins over service.name in OTEL_RESOURCE_ATTRIBUTES (specification).
    match get("OTEL_SERVICE_NAME") {
        Some(name) => set("service.name", name.value.trim().to_string(), true),
        None => set("service.name", "sysscope".into(), false),
    }
    set("service.version", crate::build_info::VERSION.into(), false);
    if !host_name.is_empty() {
        set("host.name", host_name.to_string(), false);
    }
    let node = get("NODE_NAME")
        .map(|f| f.value)
        .or_else(|| node_name.map(str::to_string));
    if let Some(node) = node {
        set("k8s.node.name", node.trim().to_string(), false);
    }
    Ok(attrs)
}
