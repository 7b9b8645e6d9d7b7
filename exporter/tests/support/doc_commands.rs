//! What the user documentation (README.md and docs/*.md) tells people to run and where it
//! links, read out of the Markdown for the binary's own test (main.rs), which parses every
//! `sysscope ...` command line with the real argument parser and checks every local link.
//!
//! Command lines are taken from fenced blocks marked `sh`, `bash`, `shell`, `console` or
//! unmarked (program output goes in `text` blocks), and from inline code that starts with
//! `sysscope` and a subcommand or a flag. A line may start with a `$ ` prompt or environment
//! assignments, continue over `\` line ends, and run sysscope through `kubectl exec ... --`;
//! what follows `#`, a pipe, a redirection or `&&` is not sysscope's.

use std::path::{Path, PathBuf};

/// A `sysscope` command line of a document: where it is, and its arguments (the program name
/// first).
#[derive(Debug)]
pub(crate) struct CommandLine {
    pub(crate) at: String,
    pub(crate) args: Vec<String>,
}

/// A link to a file of the repository (and an anchor in it), as written.
#[derive(Debug)]
pub(crate) struct Link {
    pub(crate) at: String,
    pub(crate) target: String,
}

/// The documents: README.md and every docs/*.md, from the repository root `top`.
pub(crate) fn documents(top: &Path) -> Vec<PathBuf> {
    let mut docs = vec![top.join("README.md")];
    let mut more: Vec<PathBuf> = std::fs::read_dir(top.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

const SUBCOMMANDS: &[&str] = &["summary", "trace", "diagnose", "top", "help"];

/// Every `sysscope` command line of a Markdown text.
pub(crate) fn command_lines(name: &str, text: &str) -> Vec<CommandLine> {
    let mut out = Vec::new();
    let mut fence: Option<bool> = None; // inside a fenced block: whether it holds commands
    let mut pending = String::new();
    let mut pending_at = 0;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            fence = match fence {
                Some(_) => None,
                None => Some(matches!(
                    info.trim(),
                    "" | "sh" | "bash" | "shell" | "console"
                )),
            };
            pending.clear();
            continue;
        }
        match fence {
            Some(true) => {
                if pending.is_empty() {
                    pending_at = i + 1;
                }
                match trimmed.strip_suffix('\\') {
                    Some(head) => {
                        pending.push_str(head);
                        pending.push(' ');
                    }
                    None => {
                        pending.push_str(trimmed);
                        if let Some(args) = sysscope_args(&pending, false) {
                            out.push(CommandLine {
                                at: format!("{name}:{pending_at}"),
                                args,
                            });
                        }
                        pending.clear();
                    }
                }
            }
            Some(false) => {}
            None => {
                for span in inline_code(line) {
                    if let Some(args) = sysscope_args(span, true) {
                        out.push(CommandLine {
                            at: format!("{name}:{}", i + 1),
                            args,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The contents of the inline code spans of a line (single backticks).
fn inline_code(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        spans.push(&after[..end]);
        rest = &after[end + 1..];
    }
    spans
}

/// The arguments of the `sysscope` invocation on a shell line, if it has one. `inline`: a
/// span of prose, which names a command only with a subcommand or a flag after `sysscope`.
fn sysscope_args(line: &str, inline: bool) -> Option<Vec<String>> {
    let line = line.trim().strip_prefix("$ ").unwrap_or(line.trim());
    let words = shell_words(line);
    // The program itself, after environment assignments or a launcher's `--`.
    let start = (0..words.len()).find(|&i| {
        words[i] == "sysscope"
            && (words[..i].iter().all(|w| is_assignment(w))
                || (words[0] == "kubectl" && words[i - 1] == "--"))
    })?;
    let args: Vec<String> = words[start..].to_vec();
    let second = args.get(1).map(String::as_str).unwrap_or("");
    if inline && !(second.starts_with('-') || SUBCOMMANDS.contains(&second))
        || second.ends_with(':')
    {
        return None;
    }
    Some(args)
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(k, _)| {
        !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

/// Splits a shell line into words (quotes honoured), up to a comment, a pipe, a redirection
/// or a command separator.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == c {
                        break;
                    }
                    word.push(q);
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            '#' if !in_word => break,
            '|' | '>' | '<' | ';' | '&' => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Every link of a Markdown text to something that is not a web address.
pub(crate) fn local_links(name: &str, text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("](") {
            let after = &rest[start + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") {
                out.push(Link {
                    at: format!("{name}:{}", i + 1),
                    target: target.to_string(),
                });
            }
            rest = &after[end + 1..];
        }
    }
    out
}

/// The anchors GitHub gives a Markdown text's headings: lower case, punctuation other than
/// `-` and `_` dropped, spaces as `-`, and `-1`, `-2`, ... on repeats.
pub(crate) fn anchors(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let repeats = out
            .iter()
            .filter(|a| {
                **a == slug
                    || a.strip_prefix(&format!("{slug}-"))
                        .is_some_and(|n| n.parse::<u32>().is_ok())
            })
            .count();
        out.push(if repeats == 0 {
            slug
        } else {
            format!("{slug}-{repeats}")
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_of_shell_blocks_and_inline_code() {
        let text = "\
Run `sysscope top --by pod` or `sysscope trace: no block I/O tracks` (a message).
```sh
$ SYSSCOPE_FROM_PASSWORD=x sysscope top --from https://a \\
    --from-user u   # comment
kubectl exec -n sysscope $AGENT -- sysscope summary --pod \"ml/a b\" -d 30s > out.json
curl -s localhost:9812/metrics | grep sysscope
```
```text
sysscope top - 14:02:11 UTC
```
";
        let lines = command_lines("x.md", text);
        let args: Vec<Vec<&str>> = lines
            .iter()
            .map(|l| l.args.iter().map(String::as_str).collect())
            .collect();
        assert_eq!(
            args,
            [
                vec!["sysscope", "top", "--by", "pod"],
                vec!["sysscope", "top", "--from", "https://a", "--from-user", "u"],
                vec!["sysscope", "summary", "--pod", "ml/a b", "-d", "30s"],
            ]
        );
        assert_eq!(lines[1].at, "x.md:3");
    }

    #[test]
    fn links_and_anchors() {
        let text = "# Title\n## A `b`, c!\n## A `b`, c!\n```\n# not a heading\n```\n\
                    See [x](other.md#a-b-c-1) and [y](https://example.com) and [z](#title).\n";
        let links: Vec<String> = local_links("x.md", text)
            .into_iter()
            .map(|l| l.target)
            .collect();
        assert_eq!(links, ["other.md#a-b-c-1", "#title"]);
        assert_eq!(anchors(text), ["title", "a-b-c", "a-b-c-1"]);
    }
}
