//! Keeps the README and `docs/` true to the code: every `make` target,
//! command and flag they name exists, every relative link resolves (headings
//! included), every metric, alert and configuration key they quote is one
//! the code, the shipped rules or the configuration define, and
//! `docs/configuration.md` lists exactly the keys of `config/example.toml`
//! with the same defaults. Reads files and runs the built binary's `--help`
//! and `config`: no services, well under a second.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::cli::bin;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The README and every page of `docs/`, as (path from the root, text).
fn documents() -> Vec<(String, String)> {
    let mut names: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    names.insert(0, "README.md".to_owned());
    names.into_iter().map(|n| (n.clone(), read(&n))).collect()
}

/// Splits markdown into its fenced blocks (lines ending in `\` joined to
/// the next, as a shell reads them) and its prose.
fn split_fences(text: &str) -> (Vec<String>, String) {
    let mut fenced = Vec::new();
    let mut prose = String::new();
    let mut in_fence = false;
    let mut pending = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            prose.push('\n');
            continue;
        }
        if !in_fence {
            prose.push_str(line);
            prose.push('\n');
            continue;
        }
        prose.push('\n');
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
        } else {
            pending.push_str(line);
            fenced.push(std::mem::take(&mut pending));
        }
    }
    (fenced, prose)
}

/// The inline code spans of prose, per paragraph so that a stray backtick
/// cannot pair with one paragraphs away; line breaks inside a span become
/// spaces.
fn inline_spans(prose: &str) -> Vec<String> {
    prose
        .split("\n\n")
        .flat_map(|para| {
            para.split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.replace('\n', " "))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Every piece of code a document shows: fenced lines and inline spans.
fn snippets(text: &str) -> (Vec<String>, Vec<String>) {
    let (fenced, prose) = split_fences(text);
    (fenced, inline_spans(&prose))
}

fn all_snippets(text: &str) -> Vec<String> {
    let (mut fenced, inline) = snippets(text);
    fenced.extend(inline);
    fenced
}

/// Fails with every finding, one a line, once the parser is seen to have
/// found at least `least` things to check.
fn verdict(what: &str, seen: usize, least: usize, wrong: impl IntoIterator<Item = String>) {
    assert!(seen >= least, "found only {seen} {what}: the parser is off");
    let wrong: Vec<String> = wrong.into_iter().collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

fn is_word(t: &str) -> bool {
    !t.is_empty()
        && t.starts_with(|c: char| c.is_ascii_lowercase())
        && t.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

// ---------------------------------------------------------------- make

fn makefile_targets() -> BTreeSet<String> {
    read("Makefile")
        .lines()
        .filter_map(|l| l.split_once(':').map(|(t, _)| t))
        .filter(|t| is_word(t))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_make_target_the_docs_name_is_in_the_makefile() {
    let targets = makefile_targets();
    assert!(targets.contains("test"), "parsed the Makefile: {targets:?}");
    let mut wrong = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for snippet in all_snippets(&text) {
            let tokens: Vec<&str> = snippet.split_whitespace().collect();
            for pair in tokens.windows(2) {
                if pair[0] == "make" && is_word(pair[1]) {
                    seen += 1;
                    if !targets.contains(pair[1]) {
                        wrong.push(format!("{doc}: `make {}`: no such target", pair[1]));
                    }
                }
            }
        }
    }
    verdict("make commands", seen, 6, wrong);
}

// ---------------------------------------------------------------- the CLI

/// `outbox-sidecar <path> --help`, cached; `None` when the binary refuses
/// the path.
struct Help(BTreeMap<Vec<String>, Option<String>>);

impl Help {
    fn of(&mut self, path: &[String]) -> Option<&str> {
        self.0
            .entry(path.to_vec())
            .or_insert_with(|| {
                let out = bin()
                    .args(path)
                    .arg("--help")
                    .output()
                    .expect("run the binary");
                out.status
                    .success()
                    .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
            })
            .as_deref()
    }
}

/// The subcommands a help text lists under `Commands:`.
fn subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a help text lists under `Options:`.
fn flags(help: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in help.lines().skip_while(|l| !l.starts_with("Options:")) {
        for token in line.split_whitespace() {
            if !token.starts_with('-') && !token.starts_with('<') {
                break;
            }
            if let Some(flag) = token.strip_prefix("--") {
                out.insert(format!("--{}", flag.trim_end_matches(',')));
            }
        }
    }
    out
}

/// The command a snippet runs after `outbox-sidecar`, `cargo run --`, or
/// on its own when it starts with `events` or `dispatchers` (the README's
/// short form), as tokens up to a comment or a pipe.
fn commands(snippet: &str) -> Vec<Vec<String>> {
    let tokens: Vec<&str> = snippet.split_whitespace().collect();
    let mut starts = Vec::new();
    if matches!(tokens.first(), Some(&"events") | Some(&"dispatchers"))
        && tokens.get(1).is_some_and(|t| is_word(t))
    {
        starts.push(0);
    }
    for (i, t) in tokens.iter().enumerate() {
        if *t == "outbox-sidecar" {
            starts.push(i + 1);
        }
        if *t == "cargo" && tokens.get(i + 1) == Some(&"run") {
            if let Some(dash) = tokens[i..].iter().position(|t| *t == "--") {
                starts.push(i + dash + 1);
            }
        }
    }
    starts
        .into_iter()
        .map(|start| {
            tokens[start.min(tokens.len())..]
                .iter()
                .take_while(|t| !t.starts_with('#') && !["|", "&&", ";"].contains(t))
                .map(|t| (*t).to_owned())
                .collect::<Vec<_>>()
        })
        .filter(|c| c.first().is_some_and(|t| is_word(t)))
        .collect()
}

#[test]
fn every_command_and_flag_the_docs_name_exists() {
    let mut help = Help(BTreeMap::new());
    let top = help.of(&[]).expect("outbox-sidecar --help").to_owned();
    // Every flag of every command, for flags the docs name on their own.
    let mut any_flag = flags(&top);
    for sub in subcommands(&top) {
        let path = vec![sub];
        let text = help.of(&path).expect("a listed subcommand").to_owned();
        any_flag.extend(flags(&text));
        for leaf in subcommands(&text) {
            let mut leaf_path = path.clone();
            leaf_path.push(leaf);
            any_flag.extend(flags(help.of(&leaf_path).expect("a listed subcommand")));
        }
    }
    assert!(
        any_flag.contains("--all-failed"),
        "parsed the help: {any_flag:?}"
    );

    let mut wrong = Vec::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        let (fenced, inline) = snippets(&text);
        for snippet in fenced.iter().chain(&inline) {
            for command in commands(snippet) {
                seen += 1;
                let mut path = vec![command[0].clone()];
                let Some(text) = help.of(&path).map(str::to_owned) else {
                    wrong.push(format!("{doc}: `{snippet}`: no command `{}`", command[0]));
                    continue;
                };
                let mut rest = &command[1..];
                let subs = subcommands(&text);
                if !subs.is_empty() {
                    match rest.first() {
                        Some(sub) if subs.contains(sub) => {
                            path.push(sub.clone());
                            rest = &rest[1..];
                        }
                        Some(sub) if is_word(sub) => {
                            wrong.push(format!(
                                "{doc}: `{snippet}`: `{}` has no subcommand `{sub}` ({subs:?})",
                                path[0]
                            ));
                            continue;
                        }
                        _ => {}
                    }
                }
                let known = flags(help.of(&path).expect("a listed subcommand"));
                for token in rest.iter().filter(|t| t.starts_with("--")) {
                    let flag = token.split('=').next().unwrap_or(token);
                    if !known.contains(flag) {
                        wrong.push(format!(
                            "{doc}: `{snippet}`: `outbox-sidecar {}` has no flag {flag}",
                            path.join(" ")
                        ));
                    }
                }
            }
        }
        // Flags on their own, in the documents whose flags are the
        // sidecar's (testing.md also names the test runner's and bridge.py's).
        if doc == "README.md" || doc == "docs/operations.md" {
            for span in &inline {
                if let Some(first) = span.split_whitespace().next() {
                    if first.starts_with("--") && first.len() > 2 {
                        let flag = first.split('=').next().unwrap_or(first);
                        seen += 1;
                        if !any_flag.contains(flag) {
                            wrong.push(format!("{doc}: `{span}`: no command has {flag}"));
                        }
                    }
                }
            }
        }
    }
    verdict("commands", seen, 20, wrong);
}

// ---------------------------------------------------------------- links

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as dashes; a repeated heading gets `-1`, `-2`, ….
fn anchors(markdown: &str) -> BTreeSet<String> {
    let (_, prose) = split_fences(markdown);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for line in prose.lines() {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let slug: String = heading
            .trim_start_matches('#')
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` without `.` and `..`, or `None` when it climbs above its start.
fn normalise(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other),
        }
    }
    Some(out)
}

/// The targets of a document's links and images, outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    let (_, prose) = split_fences(markdown);
    let mut out = Vec::new();
    for para in prose.split("\n\n") {
        // Code spans are not links.
        let text: String = para.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].trim().to_owned());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut docs = documents();
    docs.push(("benches/RESULTS.md".to_owned(), read("benches/RESULTS.md")));
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (doc, text) in &docs {
        let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        for target in link_targets(text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if file.is_empty() {
                PathBuf::from(doc)
            } else {
                // A link that leaves the repository (the project's shared
                // mission folder sits beside it) cannot be checked from a
                // clone.
                match normalise(&dir.join(file)) {
                    Some(p) => p,
                    None => continue,
                }
            };
            checked += 1;
            let full = root().join(&resolved);
            if !full.exists() {
                wrong.push(format!("{doc}: ({target}): no {}", resolved.display()));
                continue;
            }
            if let Some(anchor) = anchor {
                if resolved.extension().is_some_and(|e| e == "md") {
                    let text = std::fs::read_to_string(&full).expect("read a linked page");
                    if !anchors(&text).contains(anchor) {
                        wrong.push(format!(
                            "{doc}: ({target}): no heading #{anchor} in {}",
                            resolved.display()
                        ));
                    }
                }
            }
        }
    }
    verdict("links", checked, 10, wrong);
}

// ---------------------------------------------------------------- names

/// Every file under `dirs` (relative to the root), concatenated.
fn corpus(dirs: &[&str]) -> String {
    fn walk(dir: &Path, out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                out.push_str(&text);
                out.push('\n');
            }
        }
    }
    let mut out = String::new();
    for dir in dirs {
        walk(&root().join(dir), &mut out);
    }
    out
}

/// The maximal runs of `[A-Za-z0-9_]` in `text` that start with `prefix`.
fn identifiers<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before_ok = at == 0
            || !rest[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let word = &rest[at..];
        let end = word
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(word.len());
        if before_ok {
            out.push(&word[..end]);
        }
        rest = &word[end.max(1)..];
    }
    out
}

#[test]
fn every_metric_and_alert_the_docs_quote_exists() {
    let code = corpus(&["src", "migration", "entity", "deploy", "config"]);
    let rules = read("deploy/kubernetes/prometheusrule.yaml");
    let mut wrong = BTreeSet::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for snippet in all_snippets(&text) {
            for name in identifiers(&snippet, "outbox_") {
                seen += 1;
                if !code.contains(name) {
                    wrong.insert(format!("{doc}: `{name}` is nowhere in src/ or deploy/"));
                }
            }
            for name in identifiers(&snippet, "Outbox") {
                if name.len() > "Outbox".len() && !rules.contains(&format!("alert: {name}\n")) {
                    wrong.insert(format!(
                        "{doc}: `{name}` is no alert of deploy/kubernetes/prometheusrule.yaml"
                    ));
                }
            }
        }
    }
    verdict("names", seen, 30, wrong);
}

// ---------------------------------------------------------------- configuration

/// Sections whose entries are free-form names (librdkafka settings, header
/// names), documented as one `section.*` key.
const MAP_SECTIONS: [&str; 3] = [
    "kafka.properties",
    "dispatchers.NAME.headers",
    "dispatchers.NAME.header_files",
];

const TOP_SECTIONS: [&str; 11] = [
    "database",
    "tracing",
    "ordering",
    "kafka",
    "dispatch",
    "dispatchers",
    "admin",
    "history",
    "metrics",
    "shutdown",
    "log",
];

/// `dispatchers.accounts.x` → `dispatchers.NAME.x`.
fn generic(key: &str) -> String {
    match key.split_once('.') {
        Some(("dispatchers", rest)) => match rest.split_once('.') {
            Some((_, tail)) => format!("dispatchers.NAME.{tail}"),
            None => "dispatchers.NAME".to_owned(),
        },
        _ => key.to_owned(),
    }
}

/// The keys of a TOML text, commented-out ones (`# key = value`, `# [x]`)
/// included when `commented` is set: key → its value when written active.
fn toml_keys(text: &str, commented: bool) -> BTreeMap<String, Option<String>> {
    let mut keys = BTreeMap::new();
    let mut section = String::new();
    for raw in text.lines() {
        let (line, active) = match raw.strip_prefix('#') {
            Some(rest) if commented => (rest.strip_prefix(' ').unwrap_or(rest), false),
            Some(_) => continue,
            None => (raw, true),
        };
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
            {
                section = generic(name);
                if MAP_SECTIONS.contains(&section.as_str()) {
                    keys.insert(format!("{section}.*"), None);
                }
            }
            continue;
        }
        if MAP_SECTIONS.contains(&section.as_str()) {
            continue;
        }
        let Some((key, value)) = line.split_once(" = ") else {
            continue;
        };
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
            continue;
        }
        let value = value.split(" #").next().unwrap_or(value).trim();
        keys.insert(
            format!("{section}.{key}"),
            active.then(|| value.trim_matches('"').to_owned()),
        );
    }
    keys
}

/// A documented key: its default cell and whether the row says it is not
/// in the example.
struct Documented {
    default: String,
    not_in_example: bool,
}

/// The keys of `docs/configuration.md`'s tables: rows whose first cell is
/// one key in backticks.
fn documented_keys() -> BTreeMap<String, Documented> {
    let mut out = BTreeMap::new();
    for line in read("docs/configuration.md").lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(first) = cells.first().and_then(|c| c.strip_prefix("| `")) else {
            continue;
        };
        let Some(key) = first.strip_suffix('`') else {
            continue;
        };
        if key == "key"
            || !TOP_SECTIONS
                .iter()
                .any(|s| key.starts_with(&format!("{s}.")))
        {
            continue;
        }
        out.insert(
            key.to_owned(),
            Documented {
                default: cells.get(1).copied().unwrap_or_default().to_owned(),
                not_in_example: line.contains("(not in `config/example.toml`)"),
            },
        );
    }
    out
}

#[test]
fn configuration_md_lists_exactly_the_keys_of_example_toml() {
    let example = toml_keys(&read("config/example.toml"), true);
    let documented = documented_keys();
    assert!(
        example.contains_key("dispatch.retry_delay") && example.contains_key("kafka.properties.*"),
        "parsed config/example.toml: {:?}",
        example.keys()
    );
    let mut wrong = Vec::new();
    for key in example.keys() {
        if !documented.contains_key(key) {
            wrong.push(format!(
                "`{key}` is in config/example.toml, not in docs/configuration.md"
            ));
        }
    }
    for (key, doc) in &documented {
        if !example.contains_key(key) && !doc.not_in_example {
            wrong.push(format!(
                "`{key}` is in docs/configuration.md, not in config/example.toml \
                 (mark its row \"(not in `config/example.toml`)\" if that is meant)"
            ));
        }
    }
    // An active line of the example is the default; a commented one may
    // show a value to set.
    for (key, value) in &example {
        let (Some(value), Some(doc)) = (value, documented.get(key)) else {
            continue;
        };
        if doc.default.contains("required") || value.starts_with('[') {
            continue;
        }
        let default = doc.default.split('`').nth(1).unwrap_or_default();
        if default != value {
            wrong.push(format!(
                "`{key}`: docs/configuration.md's default `{default}`, config/example.toml's `{value}`"
            ));
        }
    }
    // What the binary prints as its effective configuration is documented.
    let out = bin()
        .args(["config", "--config"])
        .arg(root().join("config/example.toml"))
        .output()
        .expect("run the binary");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in toml_keys(&String::from_utf8_lossy(&out.stdout), false).keys() {
        if !documented.contains_key(key) {
            wrong.push(format!(
                "`outbox-sidecar config` prints `{key}`, not in docs/configuration.md"
            ));
        }
    }
    verdict("keys", example.len(), 40, wrong);
}

#[test]
fn every_configuration_key_the_docs_quote_is_documented() {
    let documented: BTreeSet<String> = documented_keys().into_keys().collect();
    let mut wrong = BTreeSet::new();
    let mut seen = 0;
    for (doc, text) in documents() {
        for snippet in all_snippets(&text) {
            let Some(first) = snippet.split_whitespace().next() else {
                continue;
            };
            let key = first.trim_matches(|c| c == '[' || c == ']');
            let Some((section, _)) = key.split_once('.') else {
                continue;
            };
            if !TOP_SECTIONS.contains(&section)
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._*".contains(c))
                || [".rs", ".md", ".toml", ".yaml", ".json"]
                    .iter()
                    .any(|e| key.ends_with(e))
            {
                continue;
            }
            seen += 1;
            let key = generic(key);
            // A key, a section, or an entry of a free-form section.
            let known = documented.contains(&key)
                || documented.iter().any(|d| d.starts_with(&format!("{key}.")))
                || MAP_SECTIONS
                    .iter()
                    .any(|m| key.starts_with(&format!("{m}.")));
            if !known {
                wrong.insert(format!(
                    "{doc}: `{snippet}`: `{key}` is not in docs/configuration.md"
                ));
            }
        }
    }
    verdict("keys", seen, 30, wrong);
}
