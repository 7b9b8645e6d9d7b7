//! The configuration reference, generated from the config types themselves: each key's
//! meaning from its doc comment, its type and allowed values from its `schemars` attributes
//! (captured by `JsonSchema`), its default from `Config::default()`, and whether a reload
//! changes it from [`LIVE_KEYS`](super::LIVE_KEYS). docs/configuration.md is [`markdown`];
//! `--print-default-config` prints [`default_config_toml`], the same text as comments.
//!
//! The tests below fail when docs/configuration.md differs from the code, and when a
//! documented range or value list disagrees with what [`Config::parse`](super::Config::parse)
//! accepts.

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::Value;

use super::{
    is_live, BlockIoConfig, CollectionConfig, Config, CpuConfig, ExpositionConfig, GpuConfig,
    KubernetesConfig, LabelsConfig, LimitsConfig, SlowCallsConfig, SyscallsConfig,
};

/// One `[section]` of the file.
#[derive(Debug, Clone)]
pub(crate) struct Section {
    pub(crate) name: &'static str,
    pub(crate) doc: String,
    pub(crate) keys: Vec<Key>,
}

/// One key of a section.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    /// Dotted path, e.g. `limits.max_series`.
    // This and `bounds` are read by docs/configuration.md's generator and the tests.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) path: String,
    pub(crate) name: String,
    /// "integer", "duration", "string", ...
    pub(crate) kind: String,
    /// The default as TOML, or None when the key is unset by default.
    pub(crate) default: Option<toml::Value>,
    /// A value to show for keys unset by default (TOML).
    pub(crate) example: Option<toml::Value>,
    /// The allowed values in words ("64 to 1048576", `"auto", "on", "off"`), or empty.
    pub(crate) allowed: String,
    pub(crate) live: bool,
    /// Paragraphs of the doc comment, each on one line.
    pub(crate) doc: Vec<String>,
    /// Machine-readable bounds, for the tests that check them against the parser.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) bounds: Bounds,
}

/// What the schema says a key accepts, beyond its type.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Bounds {
    pub(crate) min: Option<u64>,
    pub(crate) max: Option<u64>,
    pub(crate) duration_min: Option<String>,
    pub(crate) duration_max: Option<String>,
    pub(crate) values: Vec<String>,
    pub(crate) min_length: Option<u64>,
    pub(crate) items: Option<(u64, u64)>,
}

fn schema_of<T: JsonSchema>() -> Schema {
    SchemaGenerator::default().into_root_schema_for::<T>()
}

/// The sections in file order, each with the schema of its type.
fn section_schemas() -> Vec<(&'static str, Schema)> {
    vec![
        ("collection", schema_of::<CollectionConfig>()),
        ("labels", schema_of::<LabelsConfig>()),
        ("limits", schema_of::<LimitsConfig>()),
        ("syscalls", schema_of::<SyscallsConfig>()),
        ("block_io", schema_of::<BlockIoConfig>()),
        ("cpu", schema_of::<CpuConfig>()),
        ("gpu", schema_of::<GpuConfig>()),
        ("slow_calls", schema_of::<SlowCallsConfig>()),
        ("kubernetes", schema_of::<KubernetesConfig>()),
        ("exposition", schema_of::<ExpositionConfig>()),
        ("otlp", schema_of_field(|c: &Config| &c.otlp)),
    ]
}

/// The schema of a field's type, named through the field.
fn schema_of_field<T: JsonSchema>(_field: fn(&Config) -> &T) -> Schema {
    schema_of::<T>()
}

/// Every documented section and key.
pub(crate) fn sections() -> Vec<Section> {
    let defaults = toml::Value::try_from(Config::default()).expect("defaults serialize");
    section_schemas()
        .into_iter()
        .map(|(name, schema)| {
            let root = schema.as_value();
            let defs = root.get("$defs").cloned().unwrap_or(Value::Null);
            let section_defaults = defaults.get(name);
            let keys = root
                .get("properties")
                .and_then(Value::as_object)
                .map(|props| {
                    props
                        .iter()
                        .map(|(key, prop)| {
                            let default = section_defaults.and_then(|d| d.get(key)).cloned();
                            describe_key(name, key, prop, &defs, default)
                        })
                        .collect()
                })
                .unwrap_or_default();
            Section {
                name,
                doc: paragraphs(root.get("description")).join(" "),
                keys,
            }
        })
        .collect()
}

fn describe_key(
    section: &str,
    name: &str,
    prop: &Value,
    defs: &Value,
    default: Option<toml::Value>,
) -> Key {
    let path = format!("{section}.{name}");
    let mut doc = paragraphs(prop.get("description"));
    // An enum type's values, each with its own doc comment.
    let target = match prop.get("$ref").and_then(Value::as_str) {
        Some(r) => defs
            .get(r.trim_start_matches("#/$defs/"))
            .cloned()
            .unwrap_or(Value::Null),
        None => prop.clone(),
    };
    let mut bounds = Bounds::default();
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64);
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let mut variant_docs = Vec::new();
    if let Some(variants) = target.get("oneOf").and_then(Value::as_array) {
        for v in variants {
            if let Some(c) = v.get("const").and_then(Value::as_str) {
                bounds.values.push(c.to_string());
                let d = paragraphs(v.get("description")).join(" ");
                if !d.is_empty() {
                    variant_docs.push(format!("\"{c}\": {d}"));
                }
            }
        }
    }
    if let Some(values) = target.get("enum").and_then(Value::as_array) {
        bounds
            .values
            .extend(values.iter().filter_map(Value::as_str).map(str::to_string));
    }
    doc.extend(variant_docs);
    bounds.min = u(&target, "minimum").filter(|&m| m > 0);
    bounds.max = u(&target, "maximum").filter(|&m| {
        // The type's own limit is no documented range.
        !(m == u64::from(u32::MAX)
            && target.get("format").and_then(Value::as_str) == Some("uint32"))
    });
    bounds.duration_min = s(&target, "x-min");
    bounds.duration_max = s(&target, "x-max");
    bounds.min_length = u(&target, "minLength");
    if let (Some(lo), Some(hi)) = (u(&target, "minItems"), u(&target, "maxItems")) {
        bounds.items = Some((lo, hi));
    }
    let types: Vec<&str> = match target.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec!["string"],
    };
    let kind = if target.get("x-type").and_then(Value::as_str) == Some("duration") {
        "duration".to_string()
    } else if types.contains(&"boolean") {
        "boolean".into()
    } else if types.contains(&"integer") {
        "integer".into()
    } else if types.contains(&"array") {
        "array of strings".into()
    } else if types.contains(&"object") {
        "table of strings".into()
    } else {
        "string".into()
    };

    let mut allowed = Vec::new();
    match (bounds.min, bounds.max) {
        (Some(lo), Some(hi)) => allowed.push(format!("{lo} to {hi}")),
        (None, Some(hi)) => allowed.push(format!("0 to {hi}")),
        (Some(lo), None) => allowed.push(format!("at least {lo}")),
        (None, None) => {}
    }
    match (&bounds.duration_min, &bounds.duration_max) {
        (Some(lo), Some(hi)) => allowed.push(format!("{lo} to {hi}")),
        (None, Some(hi)) => allowed.push(format!("at most {hi}")),
        (Some(lo), None) => allowed.push(format!("at least {lo}")),
        (None, None) => {}
    }
    if !bounds.values.is_empty() {
        let quoted: Vec<String> = bounds.values.iter().map(|v| format!("\"{v}\"")).collect();
        allowed.push(quoted.join(", "));
    }
    if bounds.min_length.is_some_and(|n| n > 0) {
        allowed.push("not empty".into());
    }
    if let Some((lo, hi)) = bounds.items {
        allowed.push(if lo == hi {
            format!("exactly {lo} items")
        } else {
            format!("{lo} to {hi} items")
        });
    }
    if let Some(c) = s(&target, "x-constraint").or_else(|| s(prop, "x-constraint")) {
        allowed.push(c);
    }
    let example = prop
        .get("examples")
        .and_then(Value::as_array)
        .and_then(|e| e.first())
        .and_then(|e| toml::Value::try_from(e).ok());
    Key {
        live: is_live(&path),
        path,
        name: name.to_string(),
        kind,
        default,
        example,
        allowed: allowed.join("; "),
        doc,
        bounds,
    }
}

/// A doc comment's paragraphs, each joined into one line (rustdoc wraps them in the source).
fn paragraphs(description: Option<&Value>) -> Vec<String> {
    let text = description.and_then(Value::as_str).unwrap_or("");
    text.split("\n\n")
        .map(|p| p.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect()
}

/// A TOML value as it is written after `key = `.
fn toml_inline(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(t) if t.is_empty() => "{}".into(),
        // A long list reads better one item per line.
        toml::Value::Array(items) if items.len() > 4 => {
            let mut out = String::from("[\n");
            for item in items {
                out.push_str(&format!("    {item},\n"));
            }
            out.push(']');
            out
        }
        other => other.to_string(),
    }
}

fn reload_word(live: bool) -> &'static str {
    if live {
        "live"
    } else {
        "restart"
    }
}

/// docs/configuration.md (written by the test that checks it, with `SYSSCOPE_BLESS=1`).
#[cfg(test)]
pub(crate) fn markdown() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from the config types in exporter/src/config/ (their doc comments and\n\
         schema attributes): do not edit by hand. After changing a config type, run\n\
         `SYSSCOPE_BLESS=1 cargo test --lib config::reference` to regenerate it. -->\n\n\
         sysscope reads one TOML file, given with `--config.file`. Every key is optional: a\n\
         missing key or section takes its default, and an unknown key, a value of the wrong type\n\
         or one outside its range is an error that names the key, before anything is loaded.\n\
         `sysscope --print-default-config` prints this reference as a commented configuration\n\
         file with every default.\n\n\
         **Reload**: keys marked *live* change while sysscope runs, on `SIGHUP` or\n\
         `POST /-/reload` (`systemctl reload sysscope`); a reload that changes any other key is\n\
         refused and names the key, which needs a restart ([operations](operations.md)).\n\
         Durations are written like `\"250ms\"`, `\"10s\"`, `\"5m\"` or `\"1h\"`.\n",
    );
    out.push_str(
        "\n**Flags**: `--collector.<name>` and `--no-collector.<name>` set a collector's key\n\
         and win over the file, at start and at every reload:",
    );
    for (name, key) in super::flags::COLLECTORS {
        out.push_str(&format!(" `{name}` sets `{key}`;"));
    }
    out.pop();
    out.push_str(".\n");
    for section in sections() {
        out.push_str(&format!("\n## `[{}]`\n\n", section.name));
        if !section.doc.is_empty() {
            out.push_str(&format!("{}\n\n", section.doc));
        }
        out.push_str("| Key | Type | Default | Allowed | Reload |\n");
        out.push_str("| --- | --- | --- | --- | --- |\n");
        for key in &section.keys {
            let default = match &key.default {
                Some(v) => format!("`{}`", v.to_string().replace('|', "\\|")),
                None => "unset".into(),
            };
            let allowed = if key.allowed.is_empty() {
                "any".to_string()
            } else {
                key.allowed.replace('|', "\\|")
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} |\n",
                key.name,
                key.kind,
                default,
                allowed,
                reload_word(key.live)
            ));
        }
        out.push('\n');
        for key in &section.keys {
            out.push_str(&format!("- **`{}`**: {}\n", key.path, key.doc.join(" ")));
        }
    }
    out
}

/// Word-wraps `text` into `# `-comment lines of at most `width` characters.
fn comment(text: &str, width: usize, out: &mut String) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() > 1 && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    if line.len() > 1 {
        out.push_str(&line);
        out.push('\n');
    }
}

/// The sections of the file as commented TOML, every key with its doc comment, its type,
/// allowed values and reload behaviour, and its default (keys unset by default are shown
/// commented out, with an example value).
pub(crate) fn commented_sections() -> String {
    const WIDTH: usize = 96;
    let mut out = String::new();
    for section in sections() {
        out.push_str(&format!("\n[{}]\n", section.name));
        comment(&section.doc, WIDTH, &mut out);
        for key in &section.keys {
            out.push('\n');
            for p in &key.doc {
                comment(p, WIDTH, &mut out);
            }
            let mut facts = vec![key.kind.clone()];
            if !key.allowed.is_empty() {
                facts.push(key.allowed.clone());
            }
            facts.push(format!("reload: {}", reload_word(key.live)));
            comment(&facts.join("; "), WIDTH, &mut out);
            match (&key.default, &key.example) {
                (Some(v), _) => out.push_str(&format!("{} = {}\n", key.name, toml_inline(v))),
                (None, Some(e)) => out.push_str(&format!("# {} = {}\n", key.name, toml_inline(e))),
                (None, None) => out.push_str(&format!("# {} =\n", key.name)),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc_path() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md")
    }

    /// docs/configuration.md is what the code generates.
    #[test]
    fn configuration_doc_matches_the_code() {
        let generated = markdown();
        let path = doc_path();
        if std::env::var("SYSSCOPE_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &generated).unwrap();
            return;
        }
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        if on_disk != generated {
            let first = on_disk
                .lines()
                .zip(generated.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| on_disk.lines().count().min(generated.lines().count()));
            panic!(
                "docs/configuration.md differs from the config types from line {}:\n  doc:  {:?}\n  code: {:?}\n\
                 Regenerate it: SYSSCOPE_BLESS=1 cargo test --lib config::reference",
                first + 1,
                on_disk.lines().nth(first),
                generated.lines().nth(first),
            );
        }
    }

    /// Every key the file accepts (every field of every section) is documented, with a
    /// meaning, and every documented key is one the file accepts.
    #[test]
    fn every_key_is_documented_and_accepted() {
        let defaults = toml::Value::try_from(Config::default()).unwrap();
        let sections = sections();
        for section in &sections {
            for key in &section.keys {
                assert!(!key.doc.is_empty(), "{} has no doc comment", key.path);
                let value = key
                    .default
                    .clone()
                    .or_else(|| key.example.clone())
                    .unwrap_or_else(|| panic!("{}: neither a default nor an example", key.path));
                // The key exists and the value has its type (validation needs more than one
                // key for some: a client certificate with its key, files that exist).
                let text = format!("[{}]\n{} = {}\n", section.name, key.name, value);
                toml::from_str::<Config>(&text)
                    .unwrap_or_else(|e| panic!("{}: documented value rejected: {e}", key.path));
            }
            assert!(
                !section.doc.is_empty(),
                "[{}] has no doc comment",
                section.name
            );
        }
        // Every serialized default key appears in the reference.
        for (name, table) in defaults.as_table().unwrap() {
            let section = sections
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("section [{name}] is not documented"));
            for key in table.as_table().unwrap().keys() {
                assert!(
                    section.keys.iter().any(|k| &k.name == key),
                    "{name}.{key} is not documented"
                );
            }
        }
    }

    /// Each key reported as live names a documented key (a typo in LIVE_KEYS would make a
    /// reload refuse a key the docs call live).
    #[test]
    fn live_keys_are_documented_keys() {
        let sections = sections();
        for live in super::super::LIVE_KEYS {
            let found = sections
                .iter()
                .flat_map(|s| &s.keys)
                .any(|k| k.path == *live && k.live);
            assert!(
                found,
                "LIVE_KEYS names `{live}`, which the reference does not"
            );
        }
    }

    fn parse_key(section: &str, key: &str, value: &str) -> Result<(), String> {
        Config::parse(&format!("[{section}]\n{key} = {value}\n"), "range")
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// The documented ranges and value lists are the ones the parser enforces: each bound is
    /// accepted, one step past it is refused with the key named.
    #[test]
    fn documented_bounds_are_the_enforced_ones() {
        let mut checked = 0;
        for section in sections() {
            for key in &section.keys {
                let b = &key.bounds;
                let named = |r: Result<(), String>| r.is_err_and(|e| e.contains(&key.path));
                let accepted = |r: Result<(), String>| match r {
                    Ok(()) => true,
                    // Another key's rule (series_retention >= background_interval) may refuse
                    // the file: the key under test itself must not be named.
                    Err(e) => !e.contains(&format!("`{}`", key.path)),
                };
                let p = |v: String| parse_key(section.name, &key.name, &v);
                if let Some(lo) = b.min {
                    assert!(accepted(p(lo.to_string())), "{}: {lo} refused", key.path);
                    assert!(
                        named(p((lo - 1).to_string())),
                        "{}: {} accepted",
                        key.path,
                        lo - 1
                    );
                    checked += 1;
                }
                if let Some(hi) = b.max {
                    assert!(accepted(p(hi.to_string())), "{}: {hi} refused", key.path);
                    assert!(
                        named(p((hi + 1).to_string())),
                        "{}: {} accepted",
                        key.path,
                        hi + 1
                    );
                    checked += 1;
                }
                let ms = |d: &str| crate::util::duration::parse(d).unwrap().as_millis() as u64;
                if let Some(lo) = &b.duration_min {
                    assert!(
                        accepted(p(format!("\"{lo}\""))),
                        "{}: {lo} refused",
                        key.path
                    );
                    let below = format!("\"{}ms\"", ms(lo) - 1);
                    assert!(named(p(below.clone())), "{}: {below} accepted", key.path);
                    checked += 1;
                }
                if let Some(hi) = &b.duration_max {
                    assert!(
                        accepted(p(format!("\"{hi}\""))),
                        "{}: {hi} refused",
                        key.path
                    );
                    let above = format!("\"{}ms\"", ms(hi) + 1);
                    assert!(named(p(above.clone())), "{}: {above} accepted", key.path);
                    checked += 1;
                }
                if !b.values.is_empty() {
                    for v in &b.values {
                        assert!(accepted(p(format!("\"{v}\""))), "{}: {v} refused", key.path);
                    }
                    let other = p("\"undocumented\"".into());
                    assert!(
                        other.as_ref().is_err_and(|e| e.contains(&key.name)),
                        "{}: an undocumented value was accepted: {other:?}",
                        key.path
                    );
                    checked += 1;
                }
                if b.min_length == Some(1) {
                    assert!(named(p("\" \"".into())), "{}: blank accepted", key.path);
                    checked += 1;
                }
                if let Some((lo, hi)) = b.items {
                    let list = |n: u64| {
                        let item = key.default.as_ref().unwrap().as_array().unwrap()[0].clone();
                        toml::Value::Array(vec![item; n as usize]).to_string()
                    };
                    assert!(
                        named(p(list(lo - 1))),
                        "{}: {} items accepted",
                        key.path,
                        lo - 1
                    );
                    assert!(
                        named(p(list(hi + 1))),
                        "{}: {} items accepted",
                        key.path,
                        hi + 1
                    );
                    checked += 1;
                }
            }
        }
        // The bounds exist: a schema attribute lost in a refactor fails here, not silently.
        assert!(checked >= 25, "only {checked} bounds checked");
    }
}
