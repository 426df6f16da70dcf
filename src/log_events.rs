//! The log event catalogue's check. Every INFO, WARN and ERROR line names
//! its condition in an `event` field (the embedded broker's named lines
//! too); docs/OPERATIONS.md ("Log events")
//! lists each name with its level. These tests read both, so neither can
//! change without the other.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// `(name, level)` of every event the code under `src/` logs.
fn logged() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (file, text) in sources() {
        for (at, _) in text.match_indices(FIELD) {
            let name: String = text[at + FIELD.len()..]
                .chars()
                .take_while(|c| *c != '"')
                .collect();
            // A variable that happens to be called `event` (the broker's
            // connection history) is not a log event's name.
            if !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                continue;
            }
            let level = level_before(&text[..at]).unwrap_or_else(|| {
                panic!(
                    "{}: `{name}` is not in an info!, warn! or error!",
                    file.display()
                )
            });
            out.insert((name, level.to_string()));
        }
    }
    out
}

const FIELD: &str = "event = \"";

/// The macro an `event` field belongs to: the nearest one opened before it.
fn level_before(text: &str) -> Option<&'static str> {
    ["info!(", "warn!(", "error!("]
        .into_iter()
        .filter_map(|m| text.rfind(m).map(|at| (at, m)))
        .max()
        .map(|(_, m)| match m {
            "info!(" => "INFO",
            "warn!(" => "WARN",
            _ => "ERROR",
        })
}

/// Every Rust source of ferry's own code and of the vendored broker
/// (ferry's own code too) but this file, with its text.
fn sources() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("vendor/rumqttd/src"), &mut files);
    files
        .into_iter()
        .filter(|f| !f.ends_with("log_events.rs"))
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `(name, level)` of every row of the "Log events" table.
fn catalogued() -> BTreeSet<(String, String)> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/OPERATIONS.md");
    let doc = std::fs::read_to_string(doc).unwrap();
    let section = doc
        .split("\n## Log events\n")
        .nth(1)
        .expect("docs/OPERATIONS.md has a \"Log events\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|row| {
            let cells: Vec<&str> = row.strip_prefix("| `")?.split(" | ").collect();
            let name = cells[0].strip_suffix('`')?;
            Some((name.to_string(), cells.get(1)?.trim().to_string()))
        })
        .collect()
}

#[test]
fn every_logged_event_is_in_the_catalogue_with_its_level() {
    let catalogue = catalogued();
    assert!(
        catalogue.len() > 50,
        "the table was not read: {catalogue:?}"
    );
    let missing: Vec<_> = logged().difference(&catalogue).cloned().collect();
    assert!(
        missing.is_empty(),
        "logged but not in docs/OPERATIONS.md \"Log events\" (or at another level): {missing:?}"
    );
}

#[test]
fn every_catalogued_event_is_logged() {
    let logged = logged();
    assert!(logged.len() > 50, "the code was not read: {logged:?}");
    let stale: Vec<_> = catalogued().difference(&logged).cloned().collect();
    assert!(
        stale.is_empty(),
        "in docs/OPERATIONS.md \"Log events\" but not logged (or at another level): {stale:?}"
    );
}

#[test]
fn each_event_has_one_level() {
    let mut seen = BTreeSet::new();
    for (name, _) in logged() {
        assert!(
            seen.insert(name.clone()),
            "`{name}` is logged at two levels"
        );
    }
}

/// `file:line` of every `info!`, `warn!` or `error!` under `src/` and the
/// vendored broker whose arguments have no `event` field.
fn unnamed_lines() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    for (file, text) in sources() {
        for m in ["info!(", "warn!(", "error!("] {
            for (at, _) in text.match_indices(m) {
                let before = text[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                if text[line_start..at].contains("//") {
                    continue;
                }
                let args = macro_args(&text[at + m.len()..]);
                if !args.contains("event = \"") && !args.contains("event=\"") {
                    let line = text[..at].matches('\n').count() + 1;
                    out.push(format!(
                        "{}:{line}",
                        file.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    out.sort();
    out
}

/// A macro call's arguments: `text` up to the `)` that closes the call,
/// past string literals' own parentheses.
fn macro_args(text: &str) -> &str {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' => depth += 1,
            ')' if depth == 0 => return &text[..i],
            ')' => depth -= 1,
            _ => {}
        }
    }
    text
}

#[test]
fn every_info_warn_and_error_line_names_its_event() {
    let unnamed = unnamed_lines();
    assert!(
        unnamed.is_empty(),
        "{} INFO/WARN/ERROR lines without an `event` field (docs/OPERATIONS.md: every line has one): {unnamed:#?}",
        unnamed.len()
    );
}
